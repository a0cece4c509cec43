//! enroot's site configuration read as it is (issue 14, point 3): a folder
//! laid out like `/etc/enroot` (enroot.conf defaults, a drop-in, mounts.d
//! with enroot's stock system lines and site binds, environ.d), named by
//! `enroot_config_path` on the plugstack line, changes the containers of
//! the real test cluster as it changes pyxis's, as root and as the
//! ordinary test user; the job's options still win, and a file others can
//! write is not used.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::private::{push_private, shared_base, unique, CredentialDir};
use common::proxy::ForwardProxy;
use common::{enroot_layout_file, give_to, Cluster, PlugstackKeys, Submitter, BOTH};

macro_rules! cluster_or_skip {
    () => {
        match Cluster::get() {
            Some(cluster) => cluster,
            None => return,
        }
    };
}

/// One test at a time: each changes the plugstack line.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What each step prints: its uid inside, the site's variables, whether
/// `/` is writable, whether the site tmpfs is mounted; and it writes a file
/// through the site's read-write bind.
const REPORT: &str = "echo uid=$(id -u) var=$SITE_VAR job=$SITE_JOB; \
     echo site-bind > /site-data/from-$SITE_WHO; \
     if touch /berth-rootfile 2>/dev/null; then echo root=writable; else echo root=readonly; fi; \
     grep -c ' /site-tmp ' /proc/self/mounts | sed 's/^/tmpfs=/'; \
     test -e /maybe && echo maybe=there || echo maybe=absent";

/// The plugstack line with `enroot_config_path=DIR` (and `extra` keys)
/// until dropped.
fn site_line(cluster: &Cluster, dir: &Path, extra: &str) -> PlugstackKeys {
    PlugstackKeys::add(
        cluster,
        &format!("enroot_config_path={} {extra}", dir.display()),
    )
}

/// Removes a folder when dropped, also after a failed assertion.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// A site folder (root's, in the cluster's state folder) as a pyxis site
/// has it; its site bind's source is `data`.
fn site_folder(cluster: &Cluster) -> PathBuf {
    let dir = Path::new(&cluster.var("BERTH_TEST_STATE_DIR"))
        .join(format!("enroot-site-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write(
        &dir.join("enroot.conf"),
        "#ENROOT_MOUNT_HOME no\nENROOT_REMAP_ROOT yes\nENROOT_ROOTFS_WRITABLE no\n\
         ENROOT_SQUASH_OPTIONS -comp lzo -noD\n",
    );
    write(
        &dir.join("mounts.d/10-system.fstab"),
        "/proc /proc none x-create=dir,rbind,rw,nosuid,nodev,noexec,rslave 0 -1\n\
         tmpfs /tmp tmpfs x-create=dir,rw,nosuid,nodev,mode=755,slave 0 -1\n\
         /etc/hosts /etc/hosts none x-create=file,bind,ro,nosuid,nodev,noexec,private 0 -1\n",
    );
    write(
        &dir.join("mounts.d/50-site.fstab"),
        "${SITE_DATA} /site-data none x-create=dir,bind,rw,nosuid 0 0\n\
         /nonexistent-berth-site /maybe none x-create=dir,bind,nofail\n\
         tmpfs /site-tmp tmpfs x-create=dir,rw,mode=1777\n\
         /data /moved none x-move\n",
    );
    write(
        &dir.join("environ.d/50-site.env"),
        "SITE_VAR=\"from-environ-d\"\nSITE_JOB=${SITE_JOBVAR}\n",
    );
    dir
}

fn uid_of(who: Submitter) -> String {
    match who {
        Submitter::Root => "0".into(),
        Submitter::User => common::tool("id", &["-u", common::TEST_USER]),
    }
}

/// Runs REPORT in busybox as `who` with `extra` options.
fn report(cluster: &Cluster, who: Submitter, data: &Path, extra: &[&str]) -> common::Run {
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    let mut args = vec!["-N1", image.as_str()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["sh", "-c", REPORT]);
    let data = data.to_str().unwrap();
    let who_name = format!("{who:?}");
    let env = [
        ("SITE_DATA", data),
        ("SITE_JOBVAR", "from-the-job"),
        ("SITE_WHO", who_name.as_str()),
    ];
    cluster.slurm_env(who, "srun", &args, &env)
}

#[test]
fn an_enroot_site_folder_sets_defaults_mounts_and_variables() {
    let cluster = cluster_or_skip!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let dir = site_folder(&cluster);
    let _dir_gone = Removed(dir.clone());
    let data = PathBuf::from(format!(
        "{}/site-data-{}",
        cluster.var("BERTH_TEST_WORKDIR"),
        std::process::id()
    ));
    std::fs::create_dir_all(&data).unwrap();
    let _data_gone = Removed(data.clone());
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).unwrap();
    let _line = site_line(&cluster, &dir, "");
    for who in BOTH {
        let run = report(&cluster, who, &data, &[]).ok();
        let lines: Vec<&str> = run.stdout.lines().collect();
        assert_eq!(
            lines,
            [
                "uid=0 var=from-environ-d job=from-the-job",
                "root=readonly",
                "tmpfs=1",
                "maybe=absent"
            ],
            "{who:?}: the site's defaults, mounts and variables\n{}",
            run.stderr
        );
        // Written through the read-write bind, as the user.
        let written = data.join(format!("from-{who:?}"));
        assert_eq!(std::fs::read_to_string(&written).unwrap(), "site-bind\n");
        let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&written).unwrap());
        assert_eq!(owner.to_string(), uid_of(who), "{who:?}: the file's owner");
        // The job's options win over the site's defaults.
        let run = report(
            &cluster,
            who,
            &data,
            &["--no-container-remap-root", "--container-writable"],
        )
        .ok();
        let first = run.stdout.lines().next().unwrap_or_default().to_string();
        assert_eq!(
            first,
            format!("uid={} var=from-environ-d job=from-the-job", uid_of(who))
        );
        assert!(
            run.stdout.contains("root=writable"),
            "{who:?}\n{}",
            run.stdout
        );
    }
    // What berth leaves out is named in one line of the node's log.
    let logs: String = ["node1", "node2"]
        .iter()
        .filter_map(|n| {
            std::fs::read_to_string(format!(
                "{}/slurmd-{n}.log",
                cluster.var("BERTH_TEST_LOG_DIR")
            ))
            .ok()
        })
        .collect();
    let line = logs
        .lines()
        .rev()
        .find(|l| l.contains(&dir.display().to_string()))
        .unwrap_or_else(|| panic!("no log line naming {}", dir.display()));
    assert!(
        line.contains("not used by berth: ENROOT_SQUASH_OPTIONS"),
        "{line}"
    );
    assert!(
        line.contains("mounts berth makes itself: /proc, /tmp, /etc/hosts"),
        "{line}"
    );
    assert!(line.contains("50-site.fstab:4: option x-move"), "{line}");
}

#[test]
fn a_site_file_others_can_write_is_not_used() {
    let cluster = cluster_or_skip!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let dir = Path::new(&cluster.var("BERTH_TEST_STATE_DIR"))
        .join(format!("enroot-site-open-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _dir_gone = Removed(dir.clone());
    write(&dir.join("enroot.conf"), "ENROOT_REMAP_ROOT no\n");
    let drop_in = dir.join("enroot.conf.d/90-open.conf");
    write(&drop_in, "ENROOT_REMAP_ROOT yes\n");
    std::fs::set_permissions(&drop_in, std::fs::Permissions::from_mode(0o666)).unwrap();
    let _line = site_line(&cluster, &dir, "");
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    for who in BOTH {
        let run = cluster.srun(who, &["-N1", &image, "id", "-u"]).ok();
        assert_eq!(
            run.stdout.trim(),
            uid_of(who),
            "{who:?}: a drop-in others can write must not remap root"
        );
    }
}

/// The words a pyxis site has on its plugstack line (beside
/// `runtime_path`, which the test cluster sets itself): pyxis's own keys,
/// those berth maps and those it ignores with a log line.
const PYXIS_KEYS: &str = "execute_entrypoint=0 container_scope=global sbatch_support=1 \
     use_enroot_load=0 importer=/usr/share/pyxis/importer.sh use_squashfuse=0";

/// A private image's run: srun's output, the uid its password command
/// ran as, the image's repository.
struct PrivateRun {
    run: common::Run,
    ran_as: String,
    repository: String,
}

/// Pushes a private image and runs `id -u` in it as `who`, whose
/// credentials file (in a folder of theirs under `base`) gives the
/// password as `$(cmd)`: a command that reads a key only they can read.
fn run_private(cluster: &Cluster, who: Submitter, base: &Path) -> PrivateRun {
    let repository = format!(
        "private/{}",
        unique(&format!("site-{who:?}").to_lowercase())
    );
    let (image, _digest) = push_private(cluster, "busybox:latest", &repository);
    let user = match who {
        Submitter::Root => "root",
        Submitter::User => common::TEST_USER,
    };
    let dir = base.join(user);
    let entry = format!(
        "machine {} login {} password $(id -u > {dir}/ran-as; cat {dir}/key)\n",
        cluster.var("BERTH_TEST_BRIDGE_IP"),
        cluster.var("BERTH_TEST_TOKEN_USER"),
        dir = dir.display()
    );
    let own = CredentialDir::new(base, user, ".credentials", &entry);
    let key = dir.join("key");
    std::fs::write(&key, cluster.var("BERTH_TEST_TOKEN_PASSWORD") + "\n").unwrap();
    std::os::unix::fs::chown(&key, Some(common::uid_of_user(user)), None).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let option = format!("--container-image={image}");
    let run = cluster.slurm_env(
        who,
        "srun",
        &["-N1", &option, "id", "-u"],
        &[("ENROOT_CONFIG_PATH", own.path())],
    );
    let ran_as = std::fs::read_to_string(dir.join("ran-as")).unwrap_or_default();
    PrivateRun {
        run,
        ran_as: ran_as.trim().to_string(),
        repository,
    }
}

/// A pyxis + enroot site switched to berth with no file changed: pyxis's
/// plugstack keys on berth's line, the site's enroot folder (enroot.conf
/// defaults and its proxy for nodes that reach registries only through
/// one, mounts.d, environ.d and a hook in hooks.d), users' credentials
/// files with a `$(cmd)` password for a private image, and a squashfs file
/// that `enroot import` laid out; its jobs run as they ran under pyxis, as
/// root and as the user. (slurmd names the pyxis keys it ignores in its log
/// when it starts.)
#[test]
fn a_pyxis_enroot_site_runs_its_jobs_unchanged() {
    let cluster = cluster_or_skip!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let dir = site_folder(&cluster);
    let _dir_gone = Removed(dir.clone());
    let hook = dir.join("hooks.d/50-site.sh");
    write(
        &hook,
        "#!/bin/sh\necho \"HOOK_VAR=from-the-hook-of-$(id -u)\" >> \"$ENROOT_ENVIRON\"\n",
    );
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    // enroot's stock hooks, as its package installs them: berth does their
    // work (10-localtime.sh: the node's time zone).
    for bundled in ["10-localtime.sh", "98-nvidia.sh", "99-mellanox.sh"] {
        let path = dir.join("hooks.d").join(bundled);
        write(
            &path,
            "#!/bin/sh\necho enroot's hook must not run >&2; exit 1\n",
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let zone_file = std::fs::canonicalize("/etc/localtime").unwrap();
    let zone = format!(
        "{} {}",
        zone_file.display(),
        common::tool("md5sum", &[zone_file.to_str().unwrap()])
            .split_whitespace()
            .next()
            .unwrap()
    );
    let data = PathBuf::from(format!(
        "{}/pyxis-site-data-{}",
        cluster.var("BERTH_TEST_WORKDIR"),
        std::process::id()
    ));
    std::fs::create_dir_all(&data).unwrap();
    let _data_gone = Removed(data.clone());
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).unwrap();
    // The nodes' registry requests go through the site's proxy, named in
    // enroot.conf as enroot sites name it (no scheme).
    let proxy = ForwardProxy::start(&cluster.var("BERTH_TEST_BRIDGE_IP"));
    let conf = dir.join("enroot.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str(&format!("http_proxy {}\n", proxy.addr));
    write(&conf, &text);
    let credentials = shared_base();
    let _line = site_line(&cluster, &dir, PYXIS_KEYS);
    let work = cluster.var("BERTH_TEST_WORKDIR");
    for who in BOTH {
        // A private image, with the user's credentials file as enroot
        // reads it (ENROOT_CONFIG_PATH/.credentials, a `$(cmd)` password
        // run as the job's user), pulled through the site's proxy.
        let private = run_private(&cluster, who, credentials.path());
        assert_eq!(
            private.run.stdout.trim(),
            "0",
            "{who:?}: the private image (enroot.conf remaps root)\n{}",
            private.run.stderr
        );
        assert_eq!(
            private.ran_as,
            uid_of(who),
            "{who:?}: the password command's uid"
        );
        // enroot's 99-mellanox.sh, built in: a list of device indices the
        // node lacks (these nodes have no InfiniBand) fails the step with
        // the reason; `all` shows the node's devices, none here.
        let image = format!("--container-image={}", cluster.image("busybox:latest"));
        for (value, outcome) in [
            (
                "0",
                Err("MELLANOX_VISIBLE_DEVICES=0: this node has no InfiniBand devices"),
            ),
            ("all", Ok("ran")),
        ] {
            let run = cluster.slurm_env(
                who,
                "srun",
                &["-N1", &image, "echo", "ran"],
                &[("MELLANOX_VISIBLE_DEVICES", value)],
            );
            match outcome {
                Ok(out) => assert_eq!(run.ok().stdout.trim(), out, "{who:?}: {value}"),
                Err(needle) => {
                    run.failed_with(
                        needle,
                        &format!("{who:?}: MELLANOX_VISIBLE_DEVICES={value}"),
                    );
                }
            }
        }
        let seen = proxy.seen_from_nodes(&cluster.var("BERTH_TEST_BRIDGE_IP"), &private.repository);
        assert!(
            seen.iter().any(|line| line.contains("/blobs/")),
            "{who:?}: the nodes' pull of {} did not go through enroot.conf's proxy: {seen:?}",
            private.repository
        );
        // A registry image: enroot.conf's remapped root and read-only root,
        // the site's variables and mounts, the hook's variable (the hook
        // runs as the job's user, on the host).
        let run = report(&cluster, who, &data, &[]).ok();
        assert_eq!(
            run.stdout.lines().collect::<Vec<_>>(),
            [
                "uid=0 var=from-environ-d job=from-the-job",
                "root=readonly",
                "tmpfs=1",
                "maybe=absent"
            ],
            "{who:?}: the site's defaults, mounts and variables\n{}",
            run.stderr
        );
        let image = format!("--container-image={}", cluster.image("busybox:latest"));
        let run = cluster
            .srun(
                who,
                &[
                    "-N1",
                    &image,
                    "sh",
                    "-c",
                    "echo $HOOK_VAR; echo $(readlink /etc/localtime) \
                     $(md5sum < /etc/localtime | cut -d' ' -f1)",
                ],
            )
            .ok();
        assert_eq!(
            run.stdout.lines().collect::<Vec<_>>(),
            [format!("from-the-hook-of-{}", uid_of(who)), zone.clone()],
            "{who:?}: the site hook's variable, the node's time zone"
        );
        // A file `enroot import` made: its environment and working
        // directory; no ENTRYPOINT, as execute_entrypoint=0 says.
        let tools = format!("/opt/pyxis-site-{who:?}-{}", std::process::id());
        let file = PathBuf::from(format!(
            "{work}/pyxis-site-{who:?}-{}.sqsh",
            std::process::id()
        ));
        let _file_gone = Removed(file.clone());
        enroot_layout_file(&file, &tools);
        give_to(who, &file);
        let image = format!("--container-image={}", file.display());
        let run = cluster
            .srun(
                who,
                &[
                    "-N1",
                    &image,
                    "sh",
                    "-c",
                    "echo ran=${BERTH_ENTRYPOINT_RAN-no} env=$BERTH_TEST_ENV pwd=$(pwd)",
                ],
            )
            .ok();
        assert_eq!(
            run.stdout.trim(),
            "ran=no env=from-enroot-file pwd=/opt/app work",
            "{who:?}: the enroot-imported file"
        );
    }
    cluster.assert_nodes_healthy();
}
