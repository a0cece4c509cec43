//! Finding Slurm's commands (`scontrol`, `sbcast`) from slurmstepd: sites
//! install Slurm under prefixes such as `/opt/slurm` that slurmd's PATH (the
//! environment systemd gives it) may lack, while slurmstepd's own path says
//! where Slurm is.

use std::path::{Path, PathBuf};

/// The system folders searched after Slurm's own.
const SYSTEM_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// The folder of Slurm's user commands beside the running program, when it
/// is slurmstepd (`PREFIX/sbin/slurmstepd` -> `PREFIX/bin`) and that folder
/// holds `scontrol`.
pub fn bin_dir_beside_stepd() -> Option<PathBuf> {
    bin_dir_beside(&std::env::current_exe().ok()?)
}

/// [`bin_dir_beside_stepd`] for the program at `exe`.
fn bin_dir_beside(exe: &Path) -> Option<PathBuf> {
    let bin = exe.parent()?.parent()?.join("bin");
    bin.join("scontrol").is_file().then_some(bin)
}

/// The PATH for Slurm commands: Slurm's folder first (when known), then the
/// system's.
pub fn command_path(slurm_bin: Option<&Path>) -> String {
    match slurm_bin {
        Some(dir) => format!("{}:{SYSTEM_PATH}", dir.display()),
        None => SYSTEM_PATH.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurms_folder_comes_first_when_it_holds_scontrol() {
        let prefix = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(prefix.path().join("sbin")).unwrap();
        std::fs::create_dir_all(prefix.path().join("bin")).unwrap();
        let stepd = prefix.path().join("sbin/slurmstepd");
        assert_eq!(bin_dir_beside(&stepd), None);
        std::fs::write(prefix.path().join("bin/scontrol"), b"").unwrap();
        let bin = bin_dir_beside(&stepd).unwrap();
        assert_eq!(bin, prefix.path().join("bin"));
        assert_eq!(
            command_path(Some(&bin)),
            format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display())
        );
        assert_eq!(command_path(None), "/usr/sbin:/usr/bin:/sbin:/bin");
    }
}
