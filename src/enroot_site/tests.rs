//! Tests of [`super`]: a site folder read whole, and files root must not use.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::*;

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn site_folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        &d.join("enroot.conf"),
        "ENROOT_REMAP_ROOT yes\nENROOT_ZSTD_OPTIONS -1\n",
        0o644,
    );
    write(
        &d.join("enroot.conf.d/50-site.conf"),
        "ENROOT_MOUNT_HOME y\n",
        0o644,
    );
    write(
        &d.join("mounts.d/10-system.fstab"),
        "/proc /proc none x-create=dir,rbind,rw 0 -1\n",
        0o644,
    );
    write(
        &d.join("mounts.d/50-site.fstab"),
        "${SCRATCH} /scratch none x-create=dir,bind,rw\n/x /y none x-move\n",
        0o644,
    );
    write(&d.join("mounts.d/README"), "/not /read none bind\n", 0o644);
    write(
        &d.join("environ.d/10-terminal.env"),
        "TERM=${TERM}\n",
        0o644,
    );
    write(&d.join("environ.d/50-site.env"), "SITE=1\n", 0o644);
    dir
}

fn load(dir: &Path) -> EnrootSite {
    let lookup = |name: &str| match name {
        "SCRATCH" => Some("/scratch/u".to_string()),
        "TERM" => Some("dumb".to_string()),
        _ => None,
    };
    EnrootSite::load(dir, &lookup, &|_| true)
}

#[test]
fn a_root_owned_site_folder_is_read_whole() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let dir = site_folder();
    let site = load(dir.path());
    assert_eq!(site.defaults.remap_root, Some(true));
    assert_eq!(site.defaults.mount_home, Some(true));
    assert_eq!(site.defaults.rootfs_writable, None);
    assert_eq!(site.mounts.len(), 1, "{:?}", site.mounts);
    assert_eq!(site.mounts[0].source, Path::new("/scratch/u"));
    assert_eq!(site.env, ["TERM=dumb", "SITE=1"]);
    let line = site.summary(dir.path()).unwrap();
    assert!(
        line.contains("not used by berth: ENROOT_ZSTD_OPTIONS"),
        "{line}"
    );
    assert!(line.contains("mounts berth makes itself: /proc"), "{line}");
    assert!(line.contains("50-site.fstab:2: option x-move"), "{line}");
    assert!(!line.contains("README"), "{line}");
}

#[test]
fn files_others_can_write_or_that_are_links_are_not_used() {
    let dir = site_folder();
    let d = dir.path();
    let site = if nix::unistd::geteuid().is_root() {
        std::fs::set_permissions(
            d.join("enroot.conf.d/50-site.conf"),
            std::fs::Permissions::from_mode(0o666),
        )
        .unwrap();
        std::fs::remove_file(d.join("environ.d/50-site.env")).unwrap();
        // A link to a root-owned file root could read: still not followed.
        write(&d.join("elsewhere.env"), "LINKED=1\n", 0o644);
        std::os::unix::fs::symlink(d.join("elsewhere.env"), d.join("environ.d/50-site.env"))
            .unwrap();
        std::fs::set_permissions(d.join("mounts.d"), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        load(d)
    } else {
        // Not root's at all: nothing of it is used.
        let site = load(d);
        assert_eq!(site.defaults, conf::Defaults::default());
        assert!(site.env.is_empty() && site.mounts.is_empty());
        let line = site.summary(d).unwrap();
        assert!(line.contains("it is not root's"), "{line}");
        return;
    };
    assert_eq!(
        site.defaults.mount_home, None,
        "a writable drop-in was used"
    );
    assert_eq!(site.defaults.remap_root, Some(true));
    assert!(site.mounts.is_empty(), "a writable mounts.d was used");
    assert_eq!(site.env, ["TERM=dumb"], "a symlink was followed");
    let line = site.summary(d).unwrap();
    assert!(
        line.contains("50-site.conf is not used: its group or others can write it"),
        "{line}"
    );
    assert!(line.contains("mounts.d is not used"), "{line}");
    assert!(line.contains("50-site.env"), "{line}");
}

#[test]
fn a_missing_folder_gives_nothing() {
    let site = load(Path::new("/nonexistent/enroot"));
    assert_eq!(site, EnrootSite::default());
    assert_eq!(site.summary(Path::new("/x")), None);
}

#[test]
fn hooks_d_gives_the_sites_executable_root_hooks_and_leaves_enroots_out_by_name() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let dir = site_folder();
    let hooks = dir.path().join("hooks.d");
    for (name, mode) in [
        ("50-site.sh", 0o755),
        ("20-early.sh", 0o700),
        ("30-plain.sh", 0o644),
        ("40-open.sh", 0o777),
        ("98-nvidia.sh", 0o755),
        ("99-mellanox.sh", 0o755),
        ("10-localtime.sh", 0o755),
        ("README", 0o755),
    ] {
        write(&hooks.join(name), "#!/bin/sh\n", mode);
    }
    std::os::unix::fs::symlink(hooks.join("50-site.sh"), hooks.join("60-link.sh")).unwrap();
    let site = load(dir.path());
    assert_eq!(
        site.hooks.scripts,
        [hooks.join("20-early.sh"), hooks.join("50-site.sh")]
    );
    assert_eq!(
        site.hooks.built_in,
        ["10-localtime.sh", "98-nvidia.sh", "99-mellanox.sh"]
    );
    assert!(site.hooks.not_supported.is_empty());
    assert_eq!(
        site.settings,
        [
            "ENROOT_REMAP_ROOT=yes",
            "ENROOT_ZSTD_OPTIONS=-1",
            "ENROOT_MOUNT_HOME=y"
        ]
    );
    let line = site.summary(dir.path()).unwrap();
    for part in [
        "enroot's hooks not run, berth does their work: 10-localtime.sh, 98-nvidia.sh, 99-mellanox.sh",
        "30-plain.sh is not run: not executable",
        "40-open.sh is not run: it must be root's and writable by root only",
        "60-link.sh is not run: no regular file",
    ] {
        assert!(line.contains(part), "{part}: {line}");
    }
    assert!(!line.contains("README"), "{line}");
}
