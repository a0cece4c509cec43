//! Hostile images and hostile users against the real cluster (issue 7).
//!
//! One image is built per test run from the busybox test image plus two
//! crafted layers (written with Python's tarfile, added verbatim with
//! `umoci raw add-layer`, pushed with skopeo): entries with `..` and absolute
//! paths, a symlink to a host folder used as a parent folder by the next
//! layer, a hard link to a host file, a setuid-root binary, a block device
//! node for the host's root disk, a fifo and a name with a newline. The tests
//! pull it as root and as the ordinary user, run it through srun, and check
//! that nothing on the host was read or written and that nothing inside gives
//! privilege.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{output_of, Cluster, Run, Submitter, TEST_USER};

/// Scratch folder of this test process, readable by the test user. The
/// folders of earlier test processes that ended are removed first (a
/// static has no destructor to remove its own).
fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        remove_ended_scratch();
        let dir = PathBuf::from(format!("/var/tmp/berth-security-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    })
}

/// Removes `/var/tmp/berth-security-PID` folders whose process is gone.
fn remove_ended_scratch() {
    let Ok(entries) = std::fs::read_dir("/var/tmp") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("berth-security-") else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A host folder the hostile layers aim at. World-writable, so that only
/// berth (not file permissions) stands between the image and the folder.
fn host_target() -> PathBuf {
    let dir = scratch().join("host-target");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

fn run(command: &mut Command) -> Run {
    let out = output_of(command);
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert_eq!(
        run.code, 0,
        "{command:?} failed\n--- stdout\n{}\n--- stderr\n{}",
        run.stdout, run.stderr
    );
    run
}

/// Writes the two hostile layer tars; returns their paths.
fn hostile_layers() -> (PathBuf, PathBuf) {
    let target = host_target();
    let root_dev = std::fs::metadata("/").unwrap().dev();
    let (major, minor) = (libc::major(root_dev), libc::minor(root_dev));
    let layer1 = scratch().join("layer1.tar");
    let layer2 = scratch().join("layer2.tar");
    let script = format!(
        r#"
import io, os, tarfile, sys
def add(t, name, kind=tarfile.REGTYPE, data=b"", mode=0o644, link="", dev=(0, 0), uid=0):
    i = tarfile.TarInfo(name)
    i.type, i.mode, i.linkname, i.uid, i.gid = kind, mode, link, uid, uid
    i.devmajor, i.devminor = dev
    i.size = len(data) if kind == tarfile.REGTYPE else 0
    t.addfile(i, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
pid = "{pid}"
t = tarfile.open("{layer1}", "w", format=tarfile.GNU_FORMAT)
add(t, "sec/", tarfile.DIRTYPE, mode=0o755)
add(t, "../../../../dotdot-escape-" + pid, data=b"dotdot")
add(t, "sec/../../../../../dotdot-escape2-" + pid, data=b"dotdot")
add(t, "/absolute-escape-" + pid, data=b"absolute")
add(t, "sec/esc", tarfile.SYMTYPE, link="{target}")
add(t, "sec/rootlink", tarfile.SYMTYPE, link="/")
add(t, "sec/shadow", tarfile.LNKTYPE, link="../../../../etc/shadow")
add(t, "sec/id", data=open("/usr/bin/busybox", "rb").read(), mode=0o4755)
add(t, "sec/hostdisk", tarfile.BLKTYPE, mode=0o666, dev=({major}, {minor}))
add(t, "sec/kmem", tarfile.CHRTYPE, mode=0o666, dev=(1, 2))
add(t, "sec/fifo", tarfile.FIFOTYPE, mode=0o666)
add(t, "sec/new\nline", data=b"newline")
t.close()
t = tarfile.open("{layer2}", "w", format=tarfile.GNU_FORMAT)
add(t, "sec/esc/through-symlink", data=b"through")
add(t, "sec/rootlink{target}/through-root-symlink", data=b"through-root")
add(t, "sec/rootlink/absolute-through-root-" + pid, data=b"x")
t.close()
"#,
        pid = std::process::id(),
        layer1 = layer1.display(),
        layer2 = layer2.display(),
        target = target.display(),
    );
    run(Command::new("python3").arg("-c").arg(script));
    (layer1, layer2)
}

/// Builds and pushes the hostile image once per test process; returns its name.
fn hostile_image(cluster: &Cluster) -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let registry = cluster.registry();
        let layout = scratch().join("layout");
        let (layer1, layer2) = hostile_layers();
        let layout_ref = |tag: &str| format!("{}:{tag}", layout.display());
        run(Command::new("skopeo").args([
            "copy",
            "--quiet",
            "--src-tls-verify=false",
            &format!("docker://{registry}/busybox:latest"),
            &format!("oci:{}", layout_ref("base")),
        ]));
        run(Command::new("umoci").args([
            "raw",
            "add-layer",
            "--image",
            &layout_ref("base"),
            layer1.to_str().unwrap(),
            "--tag",
            "one",
        ]));
        run(Command::new("umoci").args([
            "raw",
            "add-layer",
            "--image",
            &layout_ref("one"),
            layer2.to_str().unwrap(),
            "--tag",
            "hostile",
        ]));
        let image = format!("{registry}/security/hostile:{}", std::process::id());
        run(Command::new("skopeo").args([
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            &format!("oci:{}", layout_ref("hostile")),
            &format!("docker://{image}"),
        ]));
        image
    })
}

/// Host paths the hostile layers try to create.
fn escape_paths() -> Vec<PathBuf> {
    let pid = std::process::id();
    let target = host_target();
    let mut paths = vec![
        target.join("through-symlink"),
        target.join("through-root-symlink"),
        PathBuf::from(format!("/absolute-through-root-{pid}")),
        PathBuf::from(format!("/absolute-escape-{pid}")),
        PathBuf::from(format!("/dotdot-escape-{pid}")),
        PathBuf::from(format!("/dotdot-escape2-{pid}")),
    ];
    // `..` relative to any folder a puller might work in.
    for dir in ["/var/tmp", "/var/lib", "/var", "/tmp", "/run"] {
        paths.push(Path::new(dir).join(format!("dotdot-escape-{pid}")));
    }
    paths
}

fn assert_host_untouched() {
    for path in escape_paths() {
        assert!(
            std::fs::symlink_metadata(&path).is_err(),
            "the hostile image wrote {} on the host",
            path.display()
        );
    }
    let left: Vec<_> = std::fs::read_dir(host_target())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "the hostile image wrote into {left:?}");
}

fn berth_as(who: Submitter, args: &[&str]) -> Run {
    let berth = common::world_readable_copy(Path::new(env!("CARGO_BIN_EXE_berth")));
    let mut command = match who {
        Submitter::Root => Command::new(&berth),
        Submitter::User => {
            let mut c = Command::new("runuser");
            c.args(["-u", TEST_USER, "--"]).arg(&berth);
            c
        }
    };
    command.args(args);
    let out = output_of(&mut command);
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn user_uid() -> u32 {
    nix::unistd::User::from_name(TEST_USER)
        .unwrap()
        .expect("the test user exists")
        .uid
        .as_raw()
}

/// What runs inside the hostile container; one `key=value` line per probe.
const PROBES: &str = r#"
echo uid=$(/sec/id -u)
echo suid-mode=$(stat -c %A /sec/id)
echo hostdisk-type=$(stat -c %F /sec/hostdisk)
if head -c 512 /sec/hostdisk >/dev/null 2>&1; then echo hostdisk=READ; else echo hostdisk=denied; fi
if head -c 16 /sec/kmem >/dev/null 2>&1; then echo kmem=READ; else echo kmem=denied; fi
if cat /sec/shadow >/dev/null 2>&1; then echo shadow=READ; else echo shadow=absent; fi
echo newline=$(ls /sec | grep -c line)
if mount -o remount,rw / 2>/dev/null; then echo remount=DONE; else echo remount=denied; fi
if mount -o remount,rw,bind /ro 2>/dev/null; then echo remount-bind=DONE; else echo remount-bind=denied; fi
if touch /ro/written 2>/dev/null; then echo ro-write=DONE; else echo ro-write=denied; fi
if umount /ro 2>/dev/null; then echo umount=DONE; else echo umount=denied; fi
if umount -l /proc 2>/dev/null; then echo umount-proc=DONE; else echo umount-proc=denied; fi
if mount -t tmpfs none /mnt 2>/dev/null; then echo mount-new=DONE; else echo mount-new=denied; fi
if echo x > /sec/esc/inside 2>/dev/null; then echo esc-write=inside; else echo esc-write=denied; fi
echo done
"#;

fn probe_value<'a>(stdout: &'a str, key: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= line in\n{stdout}"))
}

#[test]
fn hostile_image_layers_never_reach_the_host() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = hostile_image(&cluster);
    let registry = cluster.registry();
    for who in common::BOTH {
        let store = scratch().join(format!("store-{who:?}"));
        std::fs::create_dir_all(&store).unwrap();
        if who == Submitter::User {
            run(Command::new("chown").arg(TEST_USER).arg(&store));
        }
        let pulled = berth_as(
            who,
            &[
                "pull",
                "--store",
                store.to_str().unwrap(),
                "--insecure-registry",
                &registry,
                image,
            ],
        );
        assert_eq!(pulled.code, 0, "{who:?}: {}", pulled.stderr);
        // The unsafe entries are named in the pull's warnings.
        assert!(
            pulled.stderr.contains("dotdot-escape") && pulled.stderr.contains("shadow"),
            "{who:?}: the pull does not name the skipped entries:\n{}",
            pulled.stderr
        );
        assert_host_untouched();
    }
}

#[test]
fn hostile_image_gives_no_privilege_in_srun() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = hostile_image(&cluster);
    let ro = scratch().join("ro");
    std::fs::create_dir_all(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mounts = format!("--container-mounts={}:/ro:ro", ro.display());
    let image_option = format!("--container-image={image}");
    // Root's jobs take another path (uid 0 maps to itself): the image's
    // device node, the locked mounts and the read-only bind must hold there
    // too.
    for who in common::BOTH {
        let out = cluster
            .srun(who, &["-N1", &image_option, &mounts, "sh", "-c", PROBES])
            .ok();
        let stdout = &out.stdout;
        assert!(stdout.contains("done"), "{who:?}: {stdout}\n{}", out.stderr);
        let uid = match who {
            Submitter::Root => "0".to_string(),
            Submitter::User => user_uid().to_string(),
        };
        assert_eq!(
            probe_value(stdout, "uid"),
            uid,
            "{who:?}: setuid-root binary gave root"
        );
        // The image keeps what its layers say; the mount makes it harmless.
        assert_eq!(probe_value(stdout, "suid-mode"), "-rwsr-xr-x");
        assert_eq!(probe_value(stdout, "hostdisk-type"), "block special file");
        for key in ["hostdisk", "kmem"] {
            assert_eq!(
                probe_value(stdout, key),
                "denied",
                "{who:?} {key}:\n{stdout}"
            );
        }
        assert_eq!(probe_value(stdout, "shadow"), "absent");
        assert_eq!(probe_value(stdout, "newline"), "1");
        for key in [
            "remount",
            "remount-bind",
            "ro-write",
            "umount",
            "umount-proc",
            "mount-new",
        ] {
            assert_eq!(
                probe_value(stdout, key),
                "denied",
                "{who:?} {key}:\n{stdout}"
            );
        }
        assert!(
            std::fs::read_dir(&ro).unwrap().next().is_none(),
            "{who:?}: a read-only bind was written"
        );
        assert_host_untouched();
    }
    cluster.assert_nodes_healthy();
}

#[test]
fn users_cannot_write_the_node_store() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    // A pull through srun fills the node stores.
    let image_option = format!("--container-image={}", cluster.image("busybox:latest"));
    cluster
        .srun(Submitter::User, &["-N2", &image_option, "true"])
        .ok();
    let stores = cluster.var("BERTH_TEST_STATE_DIR");
    let mut checked = 0;
    for node in std::fs::read_dir(Path::new(&stores).join("nodes")).unwrap() {
        let store = node.unwrap().path().join("berth-store");
        if !store.is_dir() {
            continue;
        }
        let meta = std::fs::metadata(&store).unwrap();
        assert_eq!(meta.uid(), 0, "{} is not owned by root", store.display());
        assert_eq!(
            meta.mode() & 0o022,
            0,
            "{} is writable by others",
            store.display()
        );
        let probe = store.join("images/written-by-user");
        let out = Command::new("runuser")
            .args(["-u", TEST_USER, "--", "touch"])
            .arg(&probe)
            .output()
            .unwrap();
        assert!(
            !out.status.success() && !probe.exists(),
            "the user wrote into {}",
            store.display()
        );
        checked += 1;
    }
    assert!(checked > 0, "no node store under {stores}/nodes");
}
