//! Squashfs files that users give (`--container-image=/path/x.sqfs`, a
//! `--container-save` output given back) never reach the kernel's squashfs
//! parser (issue 18, hole 3): the pull user re-packs them into the node
//! store, and the step mounts the store's copy. As root and as the ordinary
//! test user.

use crate::common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use common::{Cluster, Submitter, BOTH};

macro_rules! cluster_or_skip {
    () => {
        match Cluster::get() {
            Some(cluster) => cluster,
            None => return,
        }
    };
}

/// One test at a time: each checks at its end that nothing is left mounted.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The image's own `/tmp`: the place of the test image the user may write.
const IMAGE_TMP: &str = "--container-mounts=umount:/tmp";

/// The entries of `dir` (none when it is missing).
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A squashfs file of `who` at `path` whose `/tmp/marker` says `marker`:
/// the test image with one change, saved by a step of `who`.
fn saved_image(cluster: &Cluster, who: Submitter, node: &str, path: &str, marker: &str) {
    let _ = std::fs::remove_file(path);
    cluster
        .srun(
            who,
            &[
                "-N1",
                "-w",
                node,
                &format!("--container-image={}", cluster.image("busybox:latest")),
                &format!("--container-save={path}"),
                IMAGE_TMP,
                "sh",
                "-c",
                &format!("echo {marker} > /tmp/marker"),
            ],
        )
        .ok();
    assert!(Path::new(path).is_file(), "{who:?}: no {path}");
}

/// The backing files of every loop device of the machine.
fn loop_backing_files() -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let file = entry.path().join("loop/backing_file");
        if let Ok(text) = std::fs::read_to_string(file) {
            found.push(text.trim().to_string());
        }
    }
    found
}

/// Runs `args` through srun as `who` on a thread, and meanwhile calls
/// `during` once the step printed `ready` (its stdout is polled through a
/// file the step writes).
fn while_running(
    cluster: &Cluster,
    who: Submitter,
    args: Vec<String>,
    flag: &str,
    during: impl FnOnce(),
) -> common::Run {
    let _ = std::fs::remove_file(flag);
    std::thread::scope(|s| {
        let step = s.spawn(|| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            cluster.srun_within(who, 120, &args)
        });
        let ready = common::wait_for(Duration::from_secs(90), || Path::new(flag).exists());
        assert!(ready, "{who:?}: the step never became ready");
        during();
        step.join().unwrap()
    })
}

#[test]
fn a_users_file_is_mounted_from_the_store_copy_and_rewriting_it_changes_nothing() {
    let cluster = cluster_or_skip!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let node = cluster.first_node();
    let store = cluster.node_store(&node);
    let work = cluster.var("BERTH_TEST_WORKDIR");
    for who in BOTH {
        let file = format!("{work}/userfile-{who:?}-{}.sqfs", std::process::id());
        let other = format!("{work}/userfile-{who:?}-{}-b.sqfs", std::process::id());
        let flag = format!("{work}/userfile-{who:?}-{}.ready", std::process::id());
        saved_image(&cluster, who, &node, &file, "marker-A");
        saved_image(&cluster, who, &node, &other, "marker-B");
        let mut seen_loops = Vec::new();
        let args: Vec<String> = [
            "-N1",
            "-w",
            &node,
            &format!("--container-image={file}"),
            "sh",
            "-c",
            &format!("cat /tmp/marker; touch {flag}; sleep 6; cat /tmp/marker; echo done"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut args = args;
        // The job's working folder is mounted where it is on the host.
        args.insert(3, format!("--container-mounts=umount:/tmp,{work}:{work}"));
        let run = while_running(&cluster, who, args, &flag, || {
            seen_loops = loop_backing_files();
            // In place (same inode): the bytes of another valid image.
            let bytes = std::fs::read(&other).unwrap();
            std::fs::write(&file, bytes).unwrap();
        })
        .ok();
        assert!(
            !seen_loops.iter().any(|b| b.starts_with(&file)),
            "{who:?}: the user's file {file} backs a loop device: {seen_loops:?}"
        );
        let images = store.join("images");
        let from_store = seen_loops
            .iter()
            .any(|b| b.starts_with(images.to_str().unwrap()) && b.ends_with("/image.sqfs"));
        assert!(
            from_store,
            "{who:?}: no loop device of {} while the step ran: {seen_loops:?}",
            images.display()
        );
        let lines: Vec<&str> = run.stdout.lines().collect();
        assert_eq!(
            lines,
            ["marker-A", "marker-A", "done"],
            "{who:?}: the container must keep what it started with\n{}",
            run.stderr
        );
        // Given again, the rewritten file is imported anew.
        let run = cluster
            .srun(
                who,
                &[
                    "-N1",
                    "-w",
                    &node,
                    &format!("--container-image={file}"),
                    IMAGE_TMP,
                    "cat",
                    "/tmp/marker",
                ],
            )
            .ok();
        assert_eq!(run.stdout.trim(), "marker-B", "{who:?}\n{}", run.stderr);
        // Root recorded the file by its stamp (an entry of root's only): a
        // repeated start of the unchanged file reads none of it.
        let recorded = std::fs::read_dir(store.join("userfiles"))
            .map(|d| {
                d.flatten()
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .count()
            })
            .unwrap_or(0);
        assert!(
            recorded > 0,
            "{who:?}: no entry in {}/userfiles",
            store.display()
        );
        let meta = std::fs::metadata(store.join("userfiles")).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o700));
        let again = cluster
            .srun(
                who,
                &[
                    "-N1",
                    "-w",
                    &node,
                    &format!("--container-image={file}"),
                    IMAGE_TMP,
                    "cat",
                    "/tmp/marker",
                ],
            )
            .ok();
        assert_eq!(again.stdout.trim(), "marker-B", "{who:?}\n{}", again.stderr);
        for path in [&file, &other, &flag] {
            let _ = std::fs::remove_file(path);
        }
    }
    let left = common::berth_leftovers();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

#[test]
fn a_broken_file_is_refused_by_name_and_leaves_nothing() {
    let cluster = cluster_or_skip!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let node = cluster.first_node();
    let store = cluster.node_store(&node);
    let work = cluster.var("BERTH_TEST_WORKDIR");
    let good = format!("{work}/broken-src-{}.sqfs", std::process::id());
    saved_image(&cluster, Submitter::Root, &node, &good, "whole");
    let bytes = std::fs::read(&good).unwrap();
    let truncated = bytes[..bytes.len() / 2].to_vec();
    let mut garbage = b"hsqs".to_vec();
    garbage.extend((0..200_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    for who in BOTH {
        for (what, content) in [("truncated", &truncated), ("garbage", &garbage)] {
            let file = format!("{work}/broken-{what}-{who:?}-{}.sqfs", std::process::id());
            std::fs::write(&file, content).unwrap();
            if who == Submitter::User {
                common::tool("chown", &[common::TEST_USER, &file]);
            }
            let run = cluster
                .srun(
                    who,
                    &[
                        "-N1",
                        "-w",
                        &node,
                        &format!("--container-image={file}"),
                        "true",
                    ],
                )
                .failed();
            assert!(
                run.stderr.contains(&file) && run.stderr.contains("cannot import"),
                "{who:?} {what}: the error must name the file\n{}",
                run.stderr
            );
            // Its own entries only: other tests may pull meanwhile.
            let key = berth::store::user_file_key(&berth::registry::Digest::of_bytes(content));
            let images = entries(&store.join("images"));
            assert!(
                !images.contains(&key.hex().to_string()),
                "{who:?} {what}: a broken file left an image in the store"
            );
            let tmp = entries(&store.join("tmp"));
            assert!(
                !tmp.iter().any(|t| t.contains(key.hex())),
                "{who:?} {what}: the import left files in tmp/: {tmp:?}"
            );
            let _ = std::fs::remove_file(&file);
        }
    }
    let _ = std::fs::remove_file(&good);
    let left = common::berth_leftovers();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

#[test]
fn a_named_container_starts_from_the_store_copy_of_a_users_file() {
    let cluster = cluster_or_skip!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let node = cluster.first_node();
    let work = cluster.var("BERTH_TEST_WORKDIR");
    for who in BOTH {
        let file = format!("{work}/named-userfile-{who:?}-{}.sqfs", std::process::id());
        saved_image(&cluster, who, &node, &file, "named-marker");
        let script = format!(
            "srun --overlap -n1 --container-name=fromfile --container-image={file} {IMAGE_TMP} \
             sh -c 'cat /tmp/marker; cat /sys/block/loop*/loop/backing_file 2>/dev/null; \
             echo kept > /tmp/kept' && \
             srun --overlap -n1 --container-name=fromfile {IMAGE_TMP} cat /tmp/kept"
        );
        let run = cluster
            .slurm(who, "salloc", &["-N1", "-w", &node, "sh", "-c", &script])
            .ok();
        assert!(
            run.stdout.contains("named-marker") && run.stdout.contains("kept"),
            "{who:?}\n{}\n{}",
            run.stdout,
            run.stderr
        );
        assert!(
            !run.stdout.lines().any(|l| l.trim() == file),
            "{who:?}: the user's file backs a loop device\n{}",
            run.stdout
        );
        let _ = std::fs::remove_file(&file);
    }
    let left = common::berth_leftovers();
    assert!(left.is_empty(), "left behind: {left:#?}");
}
