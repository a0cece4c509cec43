//! Reads single settings from Slurm's configuration files (`slurm.conf`,
//! `cgroup.conf`) the way Slurm writes them: `Key=Value` lines, keys in any
//! case, `#` comments, and `Include FILE` lines (a relative FILE is taken
//! from the including file's folder).
//!
//! Only what berth needs is read: the site's `TaskProlog` (slurmstepd side)
//! and `ConstrainDevices` (`berth doctor`). This is not a full parser: lines
//! that hold several `Key=Value` words (`NodeName=...`) are looked at word by
//! word.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Whether Slurm puts jobs in a user namespace of its own (Slurm 25.11+:
/// `NamespaceType=namespace/linux` in `slurm_conf` and `CLONE_NEWUSER` among
/// the `clone_ns_flags` of the `namespace.yaml` beside it, for any node:
/// Slurm itself looks for the flag's name anywhere in the setting). A task
/// already in that namespace cannot join a container's. Files that do not
/// exist mean no.
pub fn jobs_get_a_user_namespace(slurm_conf: &Path) -> Result<bool> {
    let namespace_type = match value(slurm_conf, "NamespaceType") {
        Ok(v) => v,
        Err(_) if !slurm_conf.exists() => return Ok(false),
        Err(e) => return Err(e),
    };
    if !namespace_type.is_some_and(|t| t.eq_ignore_ascii_case("namespace/linux")) {
        return Ok(false);
    }
    let yaml = beside(slurm_conf, "namespace.yaml");
    let text = match std::fs::read_to_string(&yaml) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", yaml.display())),
    };
    Ok(text
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default())
        .any(|line| line.to_ascii_uppercase().contains("CLONE_NEWUSER")))
}

/// How deep `Include` lines may nest (Slurm's own limit is lower).
const MAX_INCLUDE_DEPTH: usize = 8;

/// The slurm.conf this process uses: `SLURM_CONF` (slurmd passes it on to
/// slurmstepd, also in configless mode), else /etc/slurm/slurm.conf.
pub fn slurm_conf_path() -> PathBuf {
    std::env::var_os("SLURM_CONF")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/slurm/slurm.conf"))
}

/// The file `name` (e.g. `cgroup.conf`) in the folder of `slurm_conf`, where
/// Slurm looks for it.
pub fn beside(slurm_conf: &Path, name: &str) -> PathBuf {
    slurm_conf.with_file_name(name)
}

/// The last value of `key` (any case) in the file at `path` and the files it
/// includes; `None` when it is not set. An empty value counts as not set.
pub fn value(path: &Path, key: &str) -> Result<Option<String>> {
    let mut found = None;
    scan(path, key, 0, &mut found)?;
    Ok(found.filter(|v: &String| !v.is_empty()))
}

fn scan(path: &Path, key: &str, depth: usize, found: &mut Option<String>) -> Result<()> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read Slurm configuration file {}", path.display()))?;
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else {
            continue;
        };
        if first.eq_ignore_ascii_case("include") {
            let Some(file) = words.next() else {
                continue;
            };
            if depth >= MAX_INCLUDE_DEPTH {
                anyhow::bail!(
                    "{}: Include nested more than {MAX_INCLUDE_DEPTH} deep",
                    path.display()
                );
            }
            let included = path
                .parent()
                .map_or_else(|| PathBuf::from(file), |dir| dir.join(file));
            scan(&included, key, depth + 1, found)?;
            continue;
        }
        for word in line.split_whitespace() {
            if let Some((name, value)) = word.split_once('=') {
                if name.eq_ignore_ascii_case(key) {
                    *found = Some(value.trim_matches('"').to_string());
                }
            }
        }
    }
    Ok(())
}

/// Whether a Slurm boolean setting's value means yes.
pub fn is_yes(value: &str) -> bool {
    matches!(
        value.to_ascii_lowercase().as_str(),
        "yes" | "true" | "1" | "y"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_found_in_any_case_through_includes() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("slurm.conf");
        std::fs::write(
            &main,
            "ClusterName=c\n# TaskProlog=/commented\ntaskprolog=/first\n\
             include extra.conf\nNodeName=n1 CPUs=4 Gres=gpu:2\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("extra.conf"),
            "TaskProlog=/etc/slurm/prolog.sh # site\n",
        )
        .unwrap();
        assert_eq!(
            value(&main, "TaskProlog").unwrap().as_deref(),
            Some("/etc/slurm/prolog.sh")
        );
        assert_eq!(value(&main, "Gres").unwrap().as_deref(), Some("gpu:2"));
        assert_eq!(value(&main, "TaskEpilog").unwrap(), None);
    }

    #[test]
    fn an_empty_value_is_not_set_and_a_missing_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("cgroup.conf");
        std::fs::write(&conf, "ConstrainDevices=\n").unwrap();
        assert_eq!(value(&conf, "ConstrainDevices").unwrap(), None);
        let e = value(&dir.path().join("nope.conf"), "X").unwrap_err();
        assert!(format!("{e:#}").contains("nope.conf"), "{e:#}");
        assert!(is_yes("Yes") && is_yes("true") && !is_yes("no"));
        assert_eq!(beside(&conf, "gres.conf"), dir.path().join("gres.conf"));
    }

    #[test]
    fn a_user_namespace_of_slurms_own_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("slurm.conf");
        let yaml = dir.path().join("namespace.yaml");
        assert!(!jobs_get_a_user_namespace(&conf).unwrap());
        std::fs::write(
            &conf,
            "NamespaceType=namespace/linux\nPrologFlags=Contain\n",
        )
        .unwrap();
        assert!(!jobs_get_a_user_namespace(&conf).unwrap());
        std::fs::write(
            &yaml,
            "defaults:\n  clone_ns_flags:\n    - \"CLONE_NEWPID\"\n  # - \"CLONE_NEWUSER\"\n",
        )
        .unwrap();
        assert!(!jobs_get_a_user_namespace(&conf).unwrap());
        std::fs::write(
            &yaml,
            "defaults:\n  clone_ns_flags:\n    - \"clone_newuser\"\n",
        )
        .unwrap();
        assert!(jobs_get_a_user_namespace(&conf).unwrap());
        std::fs::write(&conf, "NamespaceType=namespace/tmpfs\n").unwrap();
        assert!(!jobs_get_a_user_namespace(&conf).unwrap());
    }
}
