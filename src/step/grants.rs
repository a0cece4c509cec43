//! Access to a private image, checked once per node per job.
//!
//! The store hands a private image only to a user one of its registries
//! serves it to, which costs a registry request (a token exchange, often)
//! from every node at every step. Once the pull helper has let the job's
//! user have image `D` under a name (registry, repository, login), root
//! writes a grant, `<runtime>/grants/<node>/job-<JOB>/<KEY>`, and the job's
//! later steps on this node that name the same image by digest start with
//! no helper and no registry request. The grant holds the whole key (uid,
//! login, registry, repository, digest) and is believed only when it says
//! exactly that, in folders and a file that only root can write
//! ([`crate::named::trust`]). Grants go at the job's epilog: access taken
//! away from a user during a job reaches that job's later steps on a node
//! that already started it, and no other job.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest as _, Sha256};

use crate::fsutil::write_synced;
use crate::named::trust;
use crate::reference::ImageRef;

/// The grants of one node, below the runtime folder.
pub struct Grants {
    runtime: PathBuf,
    dir: PathBuf,
}

/// Who was let have what: one grant's whole content.
fn key_text(uid: u32, image: &ImageRef, manifest_digest: &str) -> String {
    format!(
        "berth access grant v1\nuid {uid}\nlogin {}\nregistry {}\nrepository {}\ndigest {manifest_digest}\n",
        image.user.as_deref().unwrap_or(""),
        image.registry,
        image.repository
    )
}

fn file_name(key: &str) -> String {
    let hash = Sha256::digest(key.as_bytes());
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

impl Grants {
    /// The grants of node `node` below `runtime_dir`
    /// (`<runtime_dir>/grants/<node>`: nodes may share a runtime folder).
    pub fn new(runtime_dir: &Path, node: &str) -> Grants {
        Grants {
            runtime: runtime_dir.to_path_buf(),
            dir: runtime_dir
                .join("grants")
                .join(trust::node_folder_name(node)),
        }
    }

    fn job_dir(&self, job: u32) -> PathBuf {
        self.dir.join(format!("job-{job}"))
    }

    /// Every folder from the runtime folder down to `job`'s is root's and
    /// writable by root only; `Ok(false)` when one does not exist.
    fn trusted(&self, job: u32) -> Result<bool> {
        trust::check_ancestors(&self.runtime)?;
        let grants = self.runtime.join("grants");
        for dir in [&self.runtime, &grants, &self.dir, &self.job_dir(job)] {
            if !trust::check_dir(dir)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Records that `uid` may have the stored image `manifest_digest` by
    /// `image`'s name in `job`.
    pub fn record(
        &self,
        job: u32,
        uid: u32,
        image: &ImageRef,
        manifest_digest: &str,
    ) -> Result<()> {
        trust::check_ancestors(&self.runtime)?;
        let dir = self.job_dir(job);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        if !self.trusted(job)? {
            anyhow::bail!("{} disappeared while a grant was written", dir.display());
        }
        let key = key_text(uid, image, manifest_digest);
        write_synced(&dir.join(file_name(&key)), key.as_bytes())
    }

    /// Whether `uid` was let have `manifest_digest` by `image`'s name in
    /// `job` on this node. A folder or grant that is not root's alone is
    /// an error (the caller asks the registry instead).
    pub fn holds(
        &self,
        job: u32,
        uid: u32,
        image: &ImageRef,
        manifest_digest: &str,
    ) -> Result<bool> {
        if !self.trusted(job)? {
            return Ok(false);
        }
        let key = key_text(uid, image, manifest_digest);
        let path = self.job_dir(job).join(file_name(&key));
        Ok(trust::read_record(&path)?.is_some_and(|bytes| bytes == key.as_bytes()))
    }

    /// Removes `job`'s grants (its epilog).
    pub fn remove_job(&self, job: u32) -> Result<()> {
        trust::check_ancestors(&self.runtime)?;
        let dir = self.job_dir(job);
        match fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("cannot remove {}", dir.display()))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const D: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    fn image(text: &str) -> ImageRef {
        ImageRef::parse(text).unwrap()
    }

    fn runtime() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let runtime = dir.path().join("run");
        fs::DirBuilder::new().mode(0o700).create(&runtime).unwrap();
        (dir, runtime)
    }

    #[test]
    fn a_grant_is_for_its_user_name_image_and_job_only() {
        let (_keep, runtime) = runtime();
        let grants = Grants::new(&runtime, "n1");
        let private = image("reg.example/team/app:1");
        grants.record(7, 1000, &private, D).unwrap();
        assert!(grants.holds(7, 1000, &private, D).unwrap());
        let other = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
        assert!(!grants.holds(7, 1001, &private, D).unwrap(), "another user");
        assert!(!grants.holds(8, 1000, &private, D).unwrap(), "another job");
        assert!(
            !grants.holds(7, 1000, &private, other).unwrap(),
            "another image"
        );
        let elsewhere = image("mirror.example/team/app:1");
        assert!(
            !grants.holds(7, 1000, &elsewhere, D).unwrap(),
            "another registry"
        );
        let login = image("bob@reg.example#team/app:1");
        assert!(!grants.holds(7, 1000, &login, D).unwrap(), "another login");
        assert!(!Grants::new(&runtime, "n2")
            .holds(7, 1000, &private, D)
            .unwrap());
        grants.remove_job(7).unwrap();
        assert!(
            !grants.holds(7, 1000, &private, D).unwrap(),
            "gone at the epilog"
        );
        grants.remove_job(7).unwrap();
    }

    #[test]
    fn a_grant_others_could_write_is_refused() {
        let (_keep, runtime) = runtime();
        let grants = Grants::new(&runtime, "n1");
        let private = image("reg.example/team/app:1");
        grants.record(7, 1000, &private, D).unwrap();
        let job_dir = runtime.join("grants/n1/job-7");
        fs::set_permissions(&job_dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(grants.holds(7, 1000, &private, D).is_err());
        fs::set_permissions(&job_dir, fs::Permissions::from_mode(0o700)).unwrap();
        let file = job_dir.join(file_name(&key_text(1000, &private, D)));
        fs::write(&file, b"berth access grant v1\nuid 0\n").unwrap();
        assert!(
            !grants.holds(7, 1000, &private, D).unwrap(),
            "content must match"
        );
    }
}
