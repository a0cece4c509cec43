//! The raw record of the `--container-*` options of one job or step, as
//! the front end took them (each value checked when given, defaults not yet
//! applied).

use anyhow::anyhow;
/// The values of the `--container-*` options for this job or step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobOptions {
    /// `--container-image`
    pub image: Option<String>,
    /// `--container-mounts`
    pub mounts: Option<String>,
    /// `--container-workdir`
    pub workdir: Option<String>,
    /// `--container-env`: variables whose job value wins over the image's.
    pub env: Option<String>,
    /// `--container-unshare`
    pub unshare: Option<String>,
    /// `--container-writable` (true) or `--container-readonly` (false).
    pub writable: Option<bool>,
    /// `--[no-]container-mount-home`
    pub mount_home: Option<bool>,
    /// `--[no-]container-remap-root`
    pub remap_root: Option<bool>,
    /// `--[no-]container-entrypoint`; `None`: the plugstack default
    /// (`execute_entrypoint`).
    pub entrypoint: Option<bool>,
    /// `--container-entrypoint-log`: show the entrypoint's output.
    pub entrypoint_log: Option<bool>,
    /// `--container-name`: `NAME[:FLAG]`.
    pub name: Option<String>,
    /// `--container-save`: where to save the root file system after the step.
    pub save: Option<String>,
    /// `--container-mpi`: the host MPI profile to inject (`none`: none).
    pub mpi: Option<String>,
    /// `--container-remove=NAME[,NAME...]`: named containers to remove.
    pub remove: Option<String>,
    /// `--container-list`: list the user's named containers.
    pub list: Option<bool>,
}

/// The names listed in `--container-env`; an empty list or name is refused
/// (`--container-env=`, `FOO,`), as is a name that is not a variable name.
pub fn env_names(value: &str) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = value.split(',').map(|n| n.trim().to_string()).collect();
    if names.iter().any(String::is_empty) {
        return Err(if value.trim().is_empty() {
            anyhow::Error::msg(
                "no variable named; give NAME[,NAME...] or drop the option".to_string(),
            )
        } else {
            anyhow::Error::msg(
                "an empty variable name (a ',' too many?); give NAME[,NAME...]".to_string(),
            )
        });
    }
    for name in &names {
        let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(anyhow!(
                "'{name}' is not a variable name (letters, digits and _, not starting with a digit)"
            ));
        }
    }
    Ok(names)
}
