//! The Slurm release the plugin was built for, against the installed
//! `slurmd` and the ones running on this node.
//!
//! Slurm loads a SPANK plugin only when the plugin's `plugin_version` names
//! its own release (major.minor); the micro number may differ. After a Slurm
//! upgrade the package's `slurmd` is new while a slurmd not yet restarted
//! still runs the old binary (its `/proc/PID/exe` then ends in
//! ` (deleted)`), so both are compared with the plugin's release.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{built_for_slurm, find_on_path, Finding, Level};

const CHECK: &str = "Slurm version";

/// `SLURM_VERSION_NUMBER` (`0xMMmmuu`) as `MM.mm.u`.
fn version_text(number: u64) -> String {
    format!(
        "{}.{:02}.{}",
        (number >> 16) & 0xff,
        (number >> 8) & 0xff,
        number & 0xff
    )
}

/// The release (major.minor) of a version such as `24.11.5`.
fn release_of(version: &str) -> String {
    version.split('.').take(2).collect::<Vec<_>>().join(".")
}

/// The version in `slurmd -V`'s output (`slurm 24.11.5`, or
/// `slurm-wlm 24.11.5` on some builds).
fn parse_v_output(stdout: &str) -> Option<String> {
    let version = stdout.split_whitespace().last()?;
    let mut parts = version.split('.');
    let numeric = |p: Option<&str>| p.is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()));
    (numeric(parts.next()) && numeric(parts.next())).then(|| version.to_string())
}

/// The version `program -V` prints, if it runs.
fn version_of(program: &Path) -> Option<String> {
    let out = Command::new(program).arg("-V").output().ok()?;
    out.status.success().then_some(())?;
    parse_v_output(&String::from_utf8_lossy(&out.stdout))
}

/// One slurmd running on this node.
struct Running {
    pid: u32,
    /// What `/proc/PID/exe` points at, ` (deleted)` stripped.
    exe: PathBuf,
    /// The binary was replaced or removed since slurmd started.
    replaced: bool,
    /// What the running binary says it is (`/proc/PID/exe -V`).
    version: Option<String>,
}

/// The slurmd processes that share this process's root directory (those of
/// a chroot or another root on the same machine are another node's).
fn running_slurmds() -> Vec<Running> {
    let Ok(own_root) = std::fs::metadata("/") else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let proc_dir = entry.path();
        let is_slurmd = std::fs::read_to_string(proc_dir.join("comm"))
            .is_ok_and(|comm| comm.trim_end() == "slurmd");
        if !is_slurmd {
            continue;
        }
        let same_root = std::fs::metadata(proc_dir.join("root"))
            .is_ok_and(|m| m.dev() == own_root.dev() && m.ino() == own_root.ino());
        let Ok(link) = std::fs::read_link(proc_dir.join("exe")) else {
            continue;
        };
        if !same_root {
            continue;
        }
        let text = link.to_string_lossy();
        let (exe, replaced) = match text.strip_suffix(" (deleted)") {
            Some(path) => (PathBuf::from(path), true),
            None => (link.clone(), false),
        };
        // The running binary itself, also when its file was replaced.
        let version = version_of(&proc_dir.join("exe"));
        found.push(Running {
            pid,
            exe,
            replaced,
            version,
        });
    }
    found.sort_by_key(|r| r.pid);
    found
}

/// The findings: the plugin against the installed slurmd, and against each
/// running slurmd of the installed binary.
pub(super) fn check() -> Vec<Finding> {
    let Some(built) = built_for_slurm() else {
        return vec![Finding::new(
            Level::Warn,
            CHECK,
            "this berth was built without the SPANK plugin (cargo feature `spank`)",
            "build with the default features (make install) on a machine with libslurm-dev",
        )];
    };
    // The running binary's path is canonical (/proc/PID/exe); PATH's may
    // go through a link (/sbin on a merged-/usr system).
    let installed_path = find_on_path("slurmd").map(|p| std::fs::canonicalize(&p).unwrap_or(p));
    let installed = installed_path.as_deref().and_then(version_of);
    let running = running_slurmds();
    compare(
        &version_text(built),
        installed_path.as_deref(),
        installed.as_deref(),
        &running,
    )
}

/// [`check`] over what was found.
fn compare(
    built: &str,
    installed_path: Option<&Path>,
    installed: Option<&str>,
    running: &[Running],
) -> Vec<Finding> {
    let rebuild = "rebuild berth against this Slurm's headers (libslurm-dev of the same release; \
                   make install, or the berth package built for it) and restart slurmd";
    let mut findings = Vec::new();
    // Only the running slurmds of the installed binary: an upgrade without
    // a restart. Slurmds of other binaries (a second Slurm under another
    // prefix) are another cluster's.
    let ours: Vec<&Running> = running
        .iter()
        .filter(|r| installed_path.is_none_or(|p| p == r.exe))
        .collect();
    match installed {
        None => findings.push(Finding::new(
            Level::Warn,
            CHECK,
            format!("plugin built for Slurm {built}; no slurmd here to compare (slurmd -V)"),
            "run berth doctor on a compute node, where slurmd is installed",
        )),
        Some(v) if release_of(v) == release_of(built) => findings.push(Finding::ok(
            CHECK,
            format!(
                "plugin built for {built}, slurmd is {v} ({} running)",
                ours.len()
            ),
        )),
        Some(v) => findings.push(Finding::new(
            Level::Fail,
            CHECK,
            format!(
                "plugin built for Slurm {built}, but the installed slurmd is {v}: slurmd {} \
                 will refuse the plugin (or load it against another ABI)",
                release_of(v)
            ),
            rebuild,
        )),
    }
    for r in ours {
        let runs = r.version.as_deref().unwrap_or("an unknown release");
        let differs = r
            .version
            .as_deref()
            .is_some_and(|v| release_of(v) != release_of(built));
        if differs {
            findings.push(Finding::new(
                Level::Fail,
                CHECK,
                format!(
                    "running slurmd (pid {}) is Slurm {runs}, but the plugin is built for {built}",
                    r.pid
                ),
                if r.replaced {
                    "restart slurmd: it still runs the binary an upgrade replaced".to_string()
                } else {
                    rebuild.to_string()
                },
            ));
        } else if r.replaced && r.version.as_deref() != installed {
            findings.push(Finding::new(
                Level::Warn,
                CHECK,
                format!(
                    "running slurmd (pid {}) is Slurm {runs} from a binary since replaced by {}",
                    r.pid,
                    installed.unwrap_or("nothing")
                ),
                "restart slurmd so that it runs the installed release",
            ));
        }
    }
    findings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(pid: u32, exe: &str, replaced: bool, version: &str) -> Running {
        Running {
            pid,
            exe: PathBuf::from(exe),
            replaced,
            version: Some(version.to_string()),
        }
    }

    fn levels(findings: &[Finding]) -> Vec<Level> {
        findings.iter().map(|f| f.level).collect()
    }

    #[test]
    fn versions_are_read_and_compared_by_release() {
        assert_eq!(version_text(0x16_05_08), "22.05.8");
        assert_eq!(version_text(0x18_0b_05), "24.11.5");
        assert_eq!(
            parse_v_output("slurm 24.11.5\n").as_deref(),
            Some("24.11.5")
        );
        assert_eq!(
            parse_v_output("slurm-wlm 26.05.5").as_deref(),
            Some("26.05.5")
        );
        assert_eq!(parse_v_output("usage: slurmd"), None);
        assert_eq!(release_of("24.11.5"), release_of("24.11.7"));
    }

    #[test]
    fn another_release_fails_with_the_fix() {
        let sbin = Path::new("/usr/sbin/slurmd");
        let ok = compare("22.05.8", Some(sbin), Some("22.05.9"), &[]);
        assert_eq!(levels(&ok), [Level::Ok]);
        let installed = compare("22.05.8", Some(sbin), Some("24.11.5"), &[]);
        assert_eq!(levels(&installed), [Level::Fail]);
        assert!(
            installed[0].to_string().contains("rebuild berth"),
            "{}",
            installed[0]
        );
        // Upgraded to 24.11 and the plugin rebuilt, but slurmd not restarted.
        let stale = compare(
            "24.11.5",
            Some(sbin),
            Some("24.11.5"),
            &[running(7, "/usr/sbin/slurmd", true, "22.05.8")],
        );
        assert_eq!(levels(&stale), [Level::Ok, Level::Fail]);
        assert!(
            stale[1].to_string().contains("restart slurmd"),
            "{}",
            stale[1]
        );
        // Another Slurm's slurmd beside this one is not this node's.
        let other = compare(
            "22.05.8",
            Some(sbin),
            Some("22.05.8"),
            &[running(8, "/opt/slurm-25.11/sbin/slurmd", false, "25.11.1")],
        );
        assert_eq!(levels(&other), [Level::Ok]);
    }
}
