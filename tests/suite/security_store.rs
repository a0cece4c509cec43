//! Store images are sealed against the pull user before the kernel mounts
//! them (issue 18, hole 3, the store half), through srun on the real
//! cluster, as root and as the ordinary user.
//!
//! The pull user writes `image.sqfs`; root's hold of the step makes it
//! `root:root 0444` and proves with a read lease that nobody still has it
//! open for writing. A pull-user process that opened the published file
//! read-write before the job makes the step fail, naming the file, without
//! mounting it; once that process is gone the same step runs.

use crate::common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use common::{output_of, tool, Cluster, Submitter, BOTH};

/// The node whose store the tests look into.
const NODE: &str = "node1";

/// The pull user of the test cluster.
const PULL_USER: &str = "berth";

/// One test at a time: they share node1's store.
static SERIAL: Mutex<()> = Mutex::new(());

/// What the container prints when it ran.
const MARKER: &str = "ran-on-the-sealed-image";

/// A name no earlier run used.
fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{tag}-{}-{nanos}", std::process::id())
}

fn store(cluster: &Cluster) -> PathBuf {
    Path::new(&cluster.var("BERTH_TEST_STATE_DIR")).join(format!("nodes/{NODE}/berth-store"))
}

/// A new image (its own digest) in the anonymous registry: `(reference, digest)`.
fn push_unique(cluster: &Cluster) -> (String, String) {
    let reference = format!("{}/berth-sealed/{}:1", cluster.registry(), unique("img"));
    let digest = common::push_with_env(
        &cluster.image("busybox:latest"),
        &format!("BERTH_SEALED={}", unique("v")),
        &reference,
        None,
    );
    (reference, digest)
}

/// Pulls `reference` into node1's store with root's CLI (which converts as
/// the pull user), so that the image is published but no step sealed it yet.
/// Returns the path of its `image.sqfs`.
fn pull_unsealed(cluster: &Cluster, reference: &str) -> PathBuf {
    let berth = common::world_readable_copy(Path::new(env!("CARGO_BIN_EXE_berth")));
    let store = store(cluster);
    let pulled = tool(
        berth.to_str().unwrap(),
        &[
            "pull",
            "--store",
            store.to_str().unwrap(),
            "--insecure-registry",
            &cluster.registry(),
            "--progress",
            "none",
            reference,
        ],
    );
    let squashfs = PathBuf::from(pulled.split_whitespace().nth(1).expect("DIGEST PATH"));
    let meta = std::fs::metadata(&squashfs).unwrap();
    assert_ne!(
        meta.uid(),
        0,
        "{} is root's before any step",
        squashfs.display()
    );
    squashfs
}

/// A process of the pull user holding `file` open read-write (`exec 3<>`),
/// started and ready.
fn writer_of(file: &Path) -> Child {
    let mut child = Command::new("setpriv")
        .args([
            &format!("--reuid={PULL_USER}"),
            &format!("--regid={PULL_USER}"),
            "--clear-groups",
            "bash",
            "-c",
            "exec 3<>\"$1\" && echo ready && exec sleep 600",
            "writer",
        ])
        .arg(file)
        .stdout(Stdio::piped())
        .spawn()
        .expect("setpriv");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(
        line.trim(),
        "ready",
        "the pull user could not open {}",
        file.display()
    );
    child
}

/// Whether `user` can open `file` for writing.
fn writable_by(user: &str, file: &Path) -> bool {
    output_of(
        Command::new("setpriv")
            .args([
                &format!("--reuid={user}"),
                &format!("--regid={user}"),
                "--clear-groups",
                "sh",
                "-c",
                "exec 3<>\"$1\"",
                "probe",
            ])
            .arg(file),
    )
    .status
    .success()
}

fn run_step(cluster: &Cluster, who: Submitter, reference: &str) -> common::Run {
    let image = format!("--container-image={reference}");
    cluster.srun(who, &["-N1", "-w", NODE, &image, "echo", MARKER])
}

/// The mode, owner and group of `file`.
fn sealed_state(file: &Path) -> (u32, u32, u32) {
    let meta = std::fs::metadata(file).unwrap();
    (meta.uid(), meta.gid(), meta.mode() & 0o7777)
}

#[test]
fn a_writer_from_before_the_job_stops_the_step_until_it_is_gone() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // A first step hands a fresh store over to the pull user (root's CLI
    // pull would otherwise convert as root).
    run_step(&cluster, Submitter::Root, &cluster.image("busybox:latest")).ok();
    for who in BOTH {
        let (reference, _digest) = push_unique(&cluster);
        let squashfs = pull_unsealed(&cluster, &reference);
        let mut writer = writer_of(&squashfs);
        let refused = run_step(&cluster, who, &reference);
        let _ = writer.kill();
        let _ = writer.wait();
        let refused = refused.failed();
        assert!(
            !refused.stdout.contains(MARKER),
            "{who:?}: the step ran on an image its writer still had open:\n{}",
            refused.stdout
        );
        assert!(
            refused.stderr.contains("still open for writing")
                && refused.stderr.contains(&squashfs.display().to_string()),
            "{who:?}: the error does not say which file is still open:\n{}",
            refused.stderr
        );
        // The file was taken from its writer even so; nothing was drained.
        assert_eq!(sealed_state(&squashfs), (0, 0, 0o444), "{who:?}");
        cluster.assert_nodes_healthy();
        // The writer is gone: the same step runs.
        let ran = run_step(&cluster, who, &reference).ok();
        assert!(ran.stdout.contains(MARKER), "{who:?}: {}", ran.stdout);
    }
}

#[test]
fn a_mounted_image_is_roots_and_read_only_and_can_still_be_removed() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let berth = common::world_readable_copy(Path::new(env!("CARGO_BIN_EXE_berth")));
    for who in BOTH {
        let (reference, digest) = push_unique(&cluster);
        // Pulled by the step itself (the plugin's pull as the pull user).
        let ran = run_step(&cluster, who, &reference).ok();
        assert!(ran.stdout.contains(MARKER), "{who:?}: {}", ran.stdout);
        let folder = store(&cluster)
            .join("images")
            .join(digest.trim_start_matches("sha256:"));
        let squashfs = folder.join("image.sqfs");
        assert_eq!(sealed_state(&squashfs), (0, 0, 0o444), "{who:?}");
        assert_eq!(std::fs::metadata(&squashfs).unwrap().nlink(), 1);
        for user in [PULL_USER, common::TEST_USER] {
            assert!(
                !writable_by(user, &squashfs),
                "{who:?}: {user} can open {} for writing",
                squashfs.display()
            );
        }
        // rmi removes the sealed file from the pull user's folder, and the
        // next step pulls and seals the image again.
        tool(
            berth.to_str().unwrap(),
            &["rmi", "--store", store(&cluster).to_str().unwrap(), &digest],
        );
        assert!(!folder.exists(), "{who:?}: rmi left {}", folder.display());
        let ran = run_step(&cluster, who, &reference).ok();
        assert!(ran.stdout.contains(MARKER), "{who:?}: {}", ran.stdout);
        assert_eq!(sealed_state(&squashfs), (0, 0, 0o444), "{who:?}");
    }
}
