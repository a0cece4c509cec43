//! The container's own mounts against its user (issue 18, hole 13), through
//! srun on the real cluster, with and without `--container-remap-root`.
//!
//! With remap-root the tasks are uid 0 of the container's user namespace,
//! which owns its mount namespace: they hold CAP_SYS_ADMIN there. berth makes
//! the user's binds and the read-only root before that namespace exists, so
//! the kernel locks them (`MNT_LOCK_READONLY`, `MNT_LOCKED`): a remount or an
//! unmount fails even then. New mounts of the container's own (a tmpfs) are
//! possible with remap-root and stay in the container (on `/tmp`, here: the
//! read-only root has no empty folder to mount on).

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use common::{Cluster, Submitter};

/// What runs inside; one `key=value` line per probe.
const PROBES: &str = r#"
if mount -o remount,rw,bind /ro 2>/dev/null; then echo remount-bind=DONE; else echo remount-bind=denied; fi
if mount -o remount,rw / 2>/dev/null; then echo remount-root=DONE; else echo remount-root=denied; fi
if mount -o remount,rw,bind / 2>/dev/null; then echo remount-root-bind=DONE; else echo remount-root-bind=denied; fi
if touch /ro/written 2>/dev/null; then echo ro-write=DONE; else echo ro-write=denied; fi
if touch /written 2>/dev/null; then echo root-write=DONE; else echo root-write=denied; fi
if umount /ro 2>/dev/null; then echo umount=DONE; else echo umount=denied; fi
if umount -l /ro 2>/dev/null; then echo umount-lazy=DONE; else echo umount-lazy=denied; fi
if mount -t tmpfs none /tmp 2>/dev/null; then echo mount-new=DONE; else echo mount-new=denied; fi
if mount --bind /ro /tmp 2>/dev/null && touch /tmp/via-rebind 2>/dev/null; then echo rebind-write=DONE; else echo rebind-write=denied; fi
echo uid=$(id -u)
echo done
"#;

fn probe_value<'a>(stdout: &'a str, key: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= line in\n{stdout}"))
}

/// A folder the user may write, bound `:ro` into the container.
fn ro_source() -> PathBuf {
    let dir = PathBuf::from(format!(
        "/var/tmp/berth-security-mounts-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

#[test]
fn read_only_binds_stay_read_only_with_and_without_remap_root() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let ro = ro_source();
    let mounts = format!("--container-mounts={}:/ro:ro", ro.display());
    let image_option = format!("--container-image={}", cluster.image("busybox:latest"));
    for remap in [false, true] {
        // Read-only, so that the root's read-only flag is tested too.
        let mut args = vec!["-N1", "--container-readonly", &image_option, &mounts];
        if remap {
            args.push("--container-remap-root");
        }
        args.extend(["sh", "-c", PROBES]);
        let out = cluster.srun(Submitter::User, &args).ok();
        let stdout = &out.stdout;
        assert!(stdout.contains("done"), "{stdout}\n{}", out.stderr);
        assert_eq!(probe_value(stdout, "uid") == "0", remap, "{stdout}");
        for key in [
            "remount-bind",
            "remount-root",
            "remount-root-bind",
            "ro-write",
            "root-write",
            "umount",
            "umount-lazy",
            "rebind-write",
        ] {
            assert_eq!(
                probe_value(stdout, key),
                "denied",
                "remap-root {remap}: {key}:\n{stdout}"
            );
        }
        // A new mount of the container's own: possible with CAP_SYS_ADMIN
        // in the container's user namespace (remap-root), not without.
        let expected_new = if remap { "DONE" } else { "denied" };
        assert_eq!(
            probe_value(stdout, "mount-new"),
            expected_new,
            "remap-root {remap}:\n{stdout}"
        );
        assert!(
            std::fs::read_dir(&ro).unwrap().next().is_none(),
            "remap-root {remap}: a read-only bind was written"
        );
    }
    let _ = std::fs::remove_dir_all(&ro);
    cluster.assert_nodes_healthy();
}
