//! slurmstepd, `--container-list` and `--container-remove=NAME[,NAME...]`:
//! the job's user lists or removes their own named containers on each node
//! of the step.
//!
//! Named containers live in the node store, which belongs to root and is
//! closed to users, so `berth containers` cannot do this for them. Here root
//! does it, before the step's tasks start, for the user Slurm authenticated
//! and the job Slurm names: which folders are touched follows from that uid,
//! that job and a name checked by [`check_name`], never from a path or a
//! file the user wrote. A container a running step uses is left alone (its
//! lock says so), and the step then fails with the message.

use super::named::scope_of;
use super::options::JobOptions;
use super::report::Report;
use super::snapshot::Snapshot;
use crate::config::Config;
use crate::named::{check_name, NamedKey, NamedRoot, NamedRoots, Registry, Scope};
use crate::privilege::with_root;
use crate::units::format_size;
use anyhow::anyhow;

/// Whether the step asks to list or remove named containers (and then runs
/// its command on the host, without a container).
pub fn wanted(options: &JobOptions) -> bool {
    options.remove.is_some() || options.list == Some(true)
}

/// The names of `--container-remove=NAME[,NAME...]`, each checked.
pub fn parse_names(value: &str) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = value.split(',').map(|n| n.trim().to_string()).collect();
    if names.iter().any(String::is_empty) {
        anyhow::bail!(
            "an empty container name (a ',' too many?); give NAME[,NAME...] as in \
             --container-name"
        );
    }
    for name in &names {
        check_name(name).map_err(anyhow::Error::msg)?;
    }
    Ok(names)
}

/// Removes, then lists, the user's named containers on this node, as the
/// options ask; every message names the node. Fails when a container could
/// not be removed (in use, or the store refused).
pub fn run(
    snapshot: &Snapshot,
    options: &JobOptions,
    config: &Config,
    report: &dyn Report,
) -> anyhow::Result<()> {
    let node = snapshot.node.as_str();
    let roots = NamedRoots::new(&config.node_state_path(node));
    let registry = Registry::new(&config.runtime_dir, node);
    let mut failures = Vec::new();
    if let Some(value) = &options.remove {
        for name in parse_names(value).map_err(|e| anyhow!("--container-remove={value}: {e:#}"))? {
            let key = NamedKey {
                uid: snapshot.uid,
                scope: scope_of(&name, snapshot.job, config.container_scope),
                name,
            };
            match with_root(|| remove_one(&roots, &registry, &key)) {
                Ok(Some(())) => report.user(&format!(
                    "{node}: removed named container {}",
                    key.describe()
                )),
                Ok(None) => report.user(&format!(
                    "{node}: no named container {} here; nothing to remove",
                    key.describe()
                )),
                Err(e) => {
                    failures.push(format!("{node}: named container {}: {e:#}", key.describe()))
                }
            }
        }
    }
    if options.list == Some(true) {
        let found = with_root(|| roots.list(Some(snapshot.uid)))
            .map_err(|e| anyhow!("{node}: cannot list your named containers: {e:#}"))?;
        for line in list_lines(node, &found) {
            report.user(&line);
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(anyhow::Error::msg(failures.join("; ")))
    }
}

/// Removes container `key` under its decision lock, so that no step starts
/// on it meanwhile: `Ok(None)` when it does not exist here, an error when a
/// step runs it (naming that step) or holds it.
fn remove_one(
    roots: &NamedRoots,
    registry: &Registry,
    key: &NamedKey,
) -> anyhow::Result<Option<()>> {
    let _decision = registry.lock(key)?;
    if let Some(step) = registry.running(key)?.first() {
        anyhow::bail!(
            "in use by step {}.{}; remove it after that step ends",
            step.job,
            step.step
        );
    }
    let Some(root) = roots.load(key)? else {
        return Ok(None);
    };
    roots.remove(&root)?;
    Ok(Some(()))
}

/// The listing: a header, then one line per container (name, scope, size
/// of its changes, image), or one line saying there is none.
pub fn list_lines(node: &str, found: &[NamedRoot]) -> Vec<String> {
    if found.is_empty() {
        return vec![format!("{node}: you have no named containers here")];
    }
    let mut lines = vec![format!(
        "{node}: {:<24} {:<12} {:>9}  IMAGE",
        "NAME", "SCOPE", "CHANGES"
    )];
    for root in found {
        let meta = &root.meta;
        let scope = match meta.scope {
            Scope::Job(job) => format!("job {job}"),
            Scope::Global => "global".to_string(),
        };
        lines.push(format!(
            "{node}: {:<24} {scope:<12} {:>9}  {}",
            meta.name,
            format_size(root.changes_size()),
            meta.image
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_one_by_one() {
        assert_eq!(parse_names("a, b").unwrap(), ["a", "b"]);
        assert!(parse_names("a,")
            .map_err(|e| format!("{e:#}"))
            .unwrap_err()
            .contains("empty container name"));
        assert!(parse_names("")
            .map_err(|e| format!("{e:#}"))
            .unwrap_err()
            .contains("empty container name"));
        assert!(parse_names("ok,../x").is_err());
    }

    #[test]
    fn an_empty_listing_says_so() {
        assert_eq!(
            list_lines("n1", &[]),
            ["n1: you have no named containers here"]
        );
    }
}
