//! Tests of [`super`]: enroot's stock lines, site binds, options, `${NAME}`.

use std::path::Path;

use super::*;
use crate::container::usermount::Propagation;

fn parsed(text: &str) -> Parsed {
    let lookup = |name: &str| (name == "SCRATCH").then(|| "/scratch/site".to_string());
    let exists = |path: &Path| path != Path::new("/nonexistent");
    let mut out = Parsed::default();
    parse(text, "site.fstab", &lookup, &exists, &mut out);
    out
}

#[test]
fn enroots_stock_lines_are_left_to_berth() {
    let text = "/proc /proc none x-create=dir,rbind,rw,nosuid,nodev,noexec,rslave 0 -1\n\
                tmpfs /tmp tmpfs x-create=dir,rw,nosuid,nodev,mode=755,slave 0 -1\n\
                /etc/hosts /etc/hosts none x-create=file,bind,ro,nosuid,nodev,noexec,private 0 -1\n\
                /etc/machine-id /etc/machine-id none x-create=file,bind,ro,nofail,silent 0 -1\n";
    let out = parsed(text);
    assert!(out.mounts.is_empty(), "{:?}", out.mounts);
    assert!(out.notes.is_empty(), "{:?}", out.notes);
    assert_eq!(
        out.left_to_berth,
        ["/proc", "/tmp", "/etc/hosts", "/etc/machine-id"]
    );
}

#[test]
fn site_binds_and_tmpfs_become_mounts() {
    let text = "# site mounts\n\
                ${SCRATCH} /scratch none x-create=dir,bind,rw,nosuid,rslave 0 0\n\
                /opt/tools opt/tools none rbind,ro\n\
                /nonexistent /maybe none x-create=dir,bind,nofail\n\
                tmpfs /cache tmpfs x-create=dir,rw,mode=1777,size=1G\n\
                /etc/site.conf /etc/site.conf bind\n";
    let out = parsed(text);
    assert!(out.notes.is_empty(), "{:?}", out.notes);
    let [scratch, tools, cache, site] = out.mounts.as_slice() else {
        panic!("{:?}", out.mounts)
    };
    assert_eq!(scratch.kind, MountKind::Bind);
    assert_eq!(scratch.source, Path::new("/scratch/site"));
    assert_eq!(scratch.target, Path::new("/scratch"));
    assert!(!scratch.read_only && scratch.flags.nosuid);
    assert_eq!(scratch.flags.propagation, Some(Propagation::Slave));
    assert!(scratch.flags.recursive_propagation);
    assert_eq!(tools.target, Path::new("/opt/tools"));
    assert!(tools.read_only);
    assert_eq!(cache.kind, MountKind::Tmpfs);
    assert_eq!(cache.tmpfs_options, ["mode=1777", "size=1G"]);
    assert_eq!(site.target, Path::new("/etc/site.conf"));
}

#[test]
fn what_berth_cannot_make_is_named() {
    let text = "none /sys none x-create=dir,x-detach,nofail,silent 0 -1\n\
                /data /data none x-move\n\
                proc /newproc proc rw\n\
                relative /x none bind\n\
                /a /../escape none bind\n\
                lonely\n";
    let out = parsed(text);
    assert!(out.mounts.is_empty(), "{:?}", out.mounts);
    let notes = out.notes.join("\n");
    assert!(notes.contains("site.fstab:2: option x-move"), "{notes}");
    assert!(notes.contains("site.fstab:3: mount type proc"), "{notes}");
    assert!(notes.contains("site.fstab:4: source relative"), "{notes}");
    assert!(notes.contains("site.fstab:5: target"), "{notes}");
    assert!(notes.contains("site.fstab:6: no target"), "{notes}");
    assert_eq!(out.left_to_berth, ["/sys"]);
}

#[test]
fn substitutes_names_as_enroot_does() {
    let lookup = |name: &str| (name == "A").then(|| "x".to_string());
    assert_eq!(
        substitute("${A}/${B}/$A/${1}/${A", &lookup),
        "x//$A/${1}/${A"
    );
}
