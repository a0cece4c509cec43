//! Per-node setup timings, shown to the user with `srun -v`.
//!
//! srun passes its verbosity to the step as `SRUN_DEBUG` in the job
//! environment (Slurm's log level: 3 by default, 4 with `-v`, 5 with `-vv`);
//! with `--export=NONE` srun sends no `SRUN_DEBUG` and the step stays quiet.
//! slurmstepd's own info and verbose messages never reach srun's terminal,
//! so the lines go through `slurm_spank_log`, only at `-v` and above.
//!
//! Stages: `lookup` (the registry or store lookup in the pull helper),
//! `pull` (the rest of the helper's run: download, convert, or wait for
//! another node of a shared store), `mount` (the container's holder),
//! `join` (the first local task entering the container).

use std::time::Duration;

/// `SRUN_DEBUG` value of `srun -v` (Slurm's `LOG_LEVEL_VERBOSE`).
const VERBOSE_LEVEL: u32 = 4;

/// What the pull helper says once its lookup is done:
/// `berth: looked up IMAGE in N ms`.
pub const LOOKUP_LINE: &str = "berth: looked up ";

/// Whether the step's srun ran with `-v` or more (`SRUN_DEBUG` of the job
/// environment).
pub fn step_is_verbose(srun_debug: Option<&str>) -> bool {
    srun_debug
        .and_then(|v| v.trim().parse::<u32>().ok())
        .is_some_and(|level| level >= VERBOSE_LEVEL)
}

/// The lookup time the pull helper reported on stderr, if it did.
pub fn lookup_from_helper(stderr: &str) -> Option<Duration> {
    let line = stderr.lines().rev().find(|l| l.starts_with(LOOKUP_LINE))?;
    let ms = line.strip_suffix(" ms")?.rsplit(' ').next()?;
    ms.parse::<u64>().ok().map(Duration::from_millis)
}

/// Lines of the pull helper's stderr the user should see whatever the
/// verbosity: a shared-store takeover of a silent puller.
pub fn helper_notes(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|l| l.contains(crate::store::shared::TAKEOVER_NOTE))
        .map(|l| l.trim_start_matches("berth: ").to_string())
        .collect()
}

/// Milliseconds, rounded, for the report.
fn ms(d: Duration) -> u128 {
    (d.as_secs_f64() * 1e3).round() as u128
}

/// Who looked the step's image up, and how long it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The pull helper (in the registry, or in the store after an access
    /// check), as it reported.
    Helper(Duration),
    /// slurmstepd itself, in the node store: no helper process, no registry
    /// request (a public image, or access already checked for the job).
    NodeStore(Duration),
}

/// The setup line of one node: `NODE: IMAGE: lookup X ms, pull Y ms, mount Z ms`.
/// `pull` is the whole helper run; the lookup is taken out of it.
pub fn setup_line(
    node: &str,
    image: &str,
    lookup: Option<Lookup>,
    pull: Duration,
    mount: Duration,
) -> String {
    format!("{node}: {image}: {}", stages(lookup, pull, mount))
}

/// Where a setup's time went: `lookup X ms, pull Y ms, mount Z ms` (for the
/// user's `srun -v` line and slurmd's log), or `lookup X ms in the node
/// store, mount Z ms` when no helper ran. `pull` is the whole helper run;
/// the lookup is taken out of it.
pub fn stages(lookup: Option<Lookup>, pull: Duration, mount: Duration) -> String {
    let mut parts = Vec::new();
    match lookup {
        Some(Lookup::NodeStore(took)) => {
            parts.push(format!("lookup {} ms in the node store", ms(took)));
        }
        Some(Lookup::Helper(took)) => {
            parts.push(format!("lookup {} ms", ms(took)));
            parts.push(format!("pull {} ms", ms(pull.saturating_sub(took))));
        }
        None => parts.push(format!("pull {} ms", ms(pull))),
    }
    parts.push(format!("mount {} ms", ms(mount)));
    parts.join(", ")
}

/// The join line of one node (its first local task).
pub fn join_line(node: &str, join: Duration) -> String {
    format!("{node}: join {} ms", ms(join))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_comes_from_srun_debug() {
        assert!(!step_is_verbose(None));
        assert!(!step_is_verbose(Some("3")));
        assert!(step_is_verbose(Some("4")));
        assert!(step_is_verbose(Some("6")));
        assert!(!step_is_verbose(Some("x")));
    }

    #[test]
    fn lookup_is_read_from_the_helper_and_taken_out_of_the_pull() {
        let stderr = "berth: resolving a\nberth: looked up a:1 in 42 ms\nberth: pulled 1 layers\n";
        let lookup = lookup_from_helper(stderr);
        assert_eq!(lookup, Some(Duration::from_millis(42)));
        assert_eq!(lookup_from_helper("berth: pulled"), None);
        let line = setup_line(
            "node1",
            "a:1@sha256:x",
            lookup.map(Lookup::Helper),
            Duration::from_millis(142),
            Duration::from_millis(7),
        );
        assert_eq!(
            line,
            "node1: a:1@sha256:x: lookup 42 ms, pull 100 ms, mount 7 ms"
        );
        let takeover =
            "berth: node2 took over the pull of sha256:ab from node1 (pid 7), silent for 30 s";
        assert_eq!(
            helper_notes(&format!("{stderr}{takeover}\n")),
            vec![takeover.trim_start_matches("berth: ").to_string()]
        );
        assert!(helper_notes(stderr).is_empty());
        assert_eq!(
            stages(
                Some(Lookup::NodeStore(Duration::from_millis(1))),
                Duration::from_millis(1),
                Duration::from_millis(7)
            ),
            "lookup 1 ms in the node store, mount 7 ms"
        );
    }
}
