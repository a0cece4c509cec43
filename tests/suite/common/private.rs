//! The token registry's private images and users' credentials files, for
//! the tests of private pulls.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::Cluster;

/// A name no earlier run used.
pub fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{tag}-{}-{nanos}", std::process::id())
}

/// Pushes `from` (in the anonymous registry) with a configuration of its
/// own to the token registry as `repository:1`, so no node has it yet.
/// Returns the reference and its manifest digest.
pub fn push_private(cluster: &Cluster, from: &str, repository: &str) -> (String, String) {
    let creds = format!(
        "{}:{}",
        cluster.var("BERTH_TEST_TOKEN_USER"),
        cluster.var("BERTH_TEST_TOKEN_PASSWORD")
    );
    push_unique(
        cluster,
        from,
        &cluster.var("BERTH_TEST_TOKEN_REGISTRY"),
        repository,
        Some(&creds),
    )
}

/// Pushes `from` (in the anonymous registry) with a configuration of its
/// own, so a new manifest digest, to `registry/repository:1`.
pub fn push_unique(
    cluster: &Cluster,
    from: &str,
    registry: &str,
    repository: &str,
    creds: Option<&str>,
) -> (String, String) {
    let reference = format!("{registry}/{repository}:1");
    let digest = super::push_with_env(
        &format!("{}/{from}", cluster.registry()),
        &format!("BERTH_PRIVATE={}", unique("v")),
        &reference,
        creds,
    );
    (reference, digest)
}

/// A folder only `user` can enter, holding one credentials file.
pub struct CredentialDir {
    dir: PathBuf,
}

impl CredentialDir {
    pub fn new(base: &Path, user: &str, file: &str, text: &str) -> CredentialDir {
        let dir = base.join(user);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
        let uid = super::uid_of_user(user);
        for path in [dir.join(file), dir.clone()] {
            std::os::unix::fs::chown(&path, Some(uid), None).unwrap();
        }
        std::fs::set_permissions(dir.join(file), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        CredentialDir { dir }
    }

    pub fn path(&self) -> &str {
        self.dir.to_str().unwrap()
    }
}

/// A folder under /var/tmp every user can enter, removed at the end.
pub fn shared_base() -> tempfile::TempDir {
    let base = tempfile::Builder::new()
        .prefix("berth-private-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    base
}
