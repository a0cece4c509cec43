//! Squashfs files carry their image's configuration (issue 14, point 2): a
//! file in enroot's layout (`/etc/environment`, `/etc/rc`, as `enroot
//! import` writes them) and a `--container-save` output run like the image
//! they came from: `PATH` and `Env`, `WorkingDir`, `ENTRYPOINT` with
//! `--container-entrypoint`. On the real test cluster, as root and as the
//! ordinary test user.

use crate::common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{enroot_layout_file, give_to, Cluster, Submitter, BOTH};

macro_rules! cluster_or_skip {
    () => {
        match Cluster::get() {
            Some(cluster) => cluster,
            None => return,
        }
    };
}

/// The pull user of the test cluster (berth's default `pull_user`).
const PULL_USER: &str = "berth";

/// One test at a time: both import into the same node store.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What the tests' command prints: the entrypoint's mark, the image's
/// variable, the working directory and `PATH`.
const SHOW: &str = "echo ran=${BERTH_ENTRYPOINT_RAN-no} env=$BERTH_TEST_ENV pwd=$(pwd) path=$PATH";

/// Removes a file when dropped, also after a failed assertion.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `srun -N1 -w NODE --container-image=IMAGE EXTRA... sh -c SHOW` as `who`.
fn show(cluster: &Cluster, who: Submitter, node: &str, image: &str, extra: &[&str]) -> String {
    let image = format!("--container-image={image}");
    let mut args = vec!["-N1", "-w", node, image.as_str()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["sh", "-c", SHOW]);
    let run = cluster.srun(who, &args).ok();
    run.stdout.trim().to_string()
}

/// The stored config of the image imported from a file whose carried
/// config names `marker`, with its owner.
fn stored_config_with(store: &Path, marker: &str) -> Option<(String, u32)> {
    std::fs::read_dir(store.join("images"))
        .ok()?
        .flatten()
        .map(|e| e.path().join("config.json"))
        .filter_map(|p| {
            let text = std::fs::read_to_string(&p).ok()?;
            let owner = std::fs::metadata(&p).ok()?.uid();
            Some((text, owner))
        })
        .find(|(text, _)| text.contains(marker))
}

fn uid_of(user: &str) -> u32 {
    let out = Command::new("id").args(["-u", user]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn a_file_in_enroots_layout_runs_like_the_image_enroot_imported() {
    let cluster = cluster_or_skip!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let node = cluster.first_node();
    let work = cluster.var("BERTH_TEST_WORKDIR");
    for who in BOTH {
        let tools = format!("/opt/tools-{who:?}-{}", std::process::id());
        let file = PathBuf::from(format!("{work}/enroot-{who:?}-{}.sqsh", std::process::id()));
        let _gone = Removed(file.clone());
        enroot_layout_file(&file, &tools);
        give_to(who, &file);
        let image = file.to_str().unwrap();
        let path = format!("path={tools}/bin:/bin");
        assert_eq!(
            show(&cluster, who, &node, image, &["--container-entrypoint"]),
            format!("ran=it's-enroots env=from-enroot-file pwd=/opt/app work {path}"),
            "{who:?}: with --container-entrypoint"
        );
        assert_eq!(
            show(&cluster, who, &node, image, &["--no-container-entrypoint"]),
            format!("ran=no env=from-enroot-file pwd=/opt/app work {path}"),
            "{who:?}: without the entrypoint"
        );
        // The pull user read the file and wrote what it found.
        let (config, owner) = stored_config_with(&cluster.node_store(&node), &tools)
            .unwrap_or_else(|| panic!("{who:?}: no stored config.json naming {tools}"));
        assert_eq!(owner, uid_of(PULL_USER), "{config}");
        assert!(config.contains("org.example.label"), "{config}");
    }
}

#[test]
fn a_saved_container_keeps_env_workdir_and_entrypoint() {
    let cluster = cluster_or_skip!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let node = cluster.first_node();
    let work = cluster.var("BERTH_TEST_WORKDIR");
    let entrypoint_image = cluster.image("busybox:entrypoint");
    let image_path = "path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    for who in BOTH {
        let file = format!("{work}/saved-{who:?}-{}.sqsh", std::process::id());
        let _ = std::fs::remove_file(&file);
        let _gone = Removed(PathBuf::from(&file));
        let before = show(
            &cluster,
            who,
            &node,
            &entrypoint_image,
            &[
                "--container-entrypoint",
                &format!("--container-save={file}"),
            ],
        );
        assert_eq!(
            before,
            format!("ran=yes env=changed-by-entrypoint pwd=/srv/work {image_path}"),
            "{who:?}: the image itself"
        );
        assert!(
            Path::new(&file).is_file(),
            "{who:?}: nothing saved at {file}"
        );
        let after = show(&cluster, who, &node, &file, &["--container-entrypoint"]);
        assert_eq!(
            after, before,
            "{who:?}: the saved file must run like its image"
        );
        let plain = show(&cluster, who, &node, &file, &["--no-container-entrypoint"]);
        assert_eq!(
            plain,
            format!("ran=no env=from-image pwd=/srv/work {image_path}"),
            "{who:?}: without the entrypoint"
        );
        // enroot's places are written too, for `enroot create` of the file.
        let cat = |inside: &str| common::tool("rdsquashfs", &["--cat", inside, &file]);
        let environment = cat("/etc/environment");
        assert!(
            environment
                .lines()
                .any(|l| l == "BERTH_TEST_ENV=from-image"),
            "{who:?}: /etc/environment of the saved file:\n{environment}"
        );
        let rc = cat("/etc/rc");
        assert!(
            rc.contains("cd \"/srv/work\" && unset OLDPWD || exit 1")
                && rc.contains("'berth-entrypoint' \"$@\""),
            "{who:?}: /etc/rc of the saved file:\n{rc}"
        );
    }
}
