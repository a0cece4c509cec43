//! slurmstepd: the folders PMI clients inside the container must see, bound
//! at their own paths.
//!
//! Slurm's mpi/pmix plugin puts them in each task's environment only after
//! `user_init`, where the container is built, but creates them before:
//! `PMIX_SERVER_TMPDIR` (`SlurmdSpoolDir/pmix.JOB.STEP`, the server's
//! rendezvous and shared-memory data store) is also in slurmstepd's own
//! environment by then, and the clients' `spmix_appdir_UID_JOB.STEP` lies
//! under `SLURM_PMIX_TMPDIR` or slurm.conf's `TmpFS` (default `/tmp`, bound
//! anyway).

use std::path::PathBuf;

use crate::container::spec::MountSpec;

/// Job environment variables whose folders the PMIx and PMI2 clients need to see.
const PMI_DIR_VARIABLES: &[&str] = &[
    "PMIX_SERVER_TMPDIR",
    "PMIX_SYSTEM_TMPDIR",
    "SLURM_PMIX_TMPDIR",
    "TMPDIR",
];

/// Where this step's PMI folders are, as known at `user_init`.
pub(super) struct PmiDirs<'a> {
    /// The job's environment.
    pub(super) job_env: &'a [String],
    /// slurmstepd's own `PMIX_SERVER_TMPDIR` (mpi/pmix sets it there).
    pub(super) server_tmpdir: Option<String>,
    /// slurm.conf's `TmpFS`, `%n` already replaced.
    pub(super) tmp_fs: Option<String>,
    pub(super) uid: u32,
    pub(super) job: u32,
    pub(super) step: u32,
}

impl PmiDirs<'_> {
    /// The binds: each existing folder outside `/tmp` (bound whole already), once.
    pub(super) fn binds(&self) -> Vec<MountSpec> {
        let job_value = |name: &str| {
            self.job_env
                .iter()
                .find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_string)
        };
        let mut candidates: Vec<String> = PMI_DIR_VARIABLES
            .iter()
            .filter_map(|name| job_value(name))
            .collect();
        candidates.extend(self.server_tmpdir.clone());
        let base = job_value("SLURM_PMIX_TMPDIR")
            .or_else(|| self.tmp_fs.clone())
            .unwrap_or_else(|| "/tmp".to_string());
        candidates.push(format!(
            "{}/spmix_appdir_{}_{}.{}",
            base.trim_end_matches('/'),
            self.uid,
            self.job,
            self.step
        ));
        let mut binds: Vec<MountSpec> = Vec::new();
        for value in candidates {
            let path = PathBuf::from(value.trim_end_matches('/'));
            if !path.is_absolute()
                || path.starts_with("/tmp")
                || !path.is_dir()
                || binds.iter().any(|b| b.source == path)
            {
                continue;
            }
            binds.push(MountSpec {
                source: path.clone(),
                target: path,
                read_only: false,
            });
        }
        binds
    }
}

/// slurm.conf's `TmpFS` for `node` (`%n` replaced), if set.
pub(super) fn tmp_fs(node: &str) -> Option<String> {
    let conf = crate::slurm_conf::slurm_conf_path();
    let value = crate::slurm_conf::value(&conf, "TmpFS").ok()??;
    Some(value.replace("%n", node))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_keep_existing_dirs_outside_tmp() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let server = tempfile::tempdir_in("/var/tmp").unwrap();
        let appbase = tempfile::tempdir_in("/var/tmp").unwrap();
        let appdir = appbase.path().join("spmix_appdir_1000_7.0");
        std::fs::create_dir(&appdir).unwrap();
        let env = vec![
            format!("PMIX_SERVER_TMPDIR={}", dir.path().display()),
            "PMIX_SYSTEM_TMPDIR=/tmp".to_string(),
            "OTHER=/etc".to_string(),
            "TMPDIR=/nonexistent/x".to_string(),
        ];
        let dirs = PmiDirs {
            job_env: &env,
            server_tmpdir: Some(format!("{}/", server.path().display())),
            tmp_fs: Some(appbase.path().display().to_string()),
            uid: 1000,
            job: 7,
            step: 0,
        };
        let sources: Vec<PathBuf> = dirs.binds().into_iter().map(|b| b.source).collect();
        assert_eq!(
            sources,
            vec![
                dir.path().to_path_buf(),
                server.path().to_path_buf(),
                appdir
            ]
        );
    }
}
