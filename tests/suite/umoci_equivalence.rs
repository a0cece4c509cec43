//! Fidelity: the squashfs `berth pull` makes of an image holds exactly the tree
//! `umoci unpack` makes of the same image, file by file.
//!
//! For each test image in the local registry (tests/harness/images.sh):
//!
//! * berth: `berth pull --json` into a fresh store, then `unsquashfs -st`
//!   (as root: owners, modes, device nodes, hardlinks and all xattrs are
//!   written; any error is fatal) into a folder;
//! * reference: `skopeo copy` of the same image into an OCI layout, then
//!   `umoci unpack` (as root) into a bundle;
//! * both trees are walked without following symlinks and every path is
//!   compared: file type, all 12 mode bits, uid, gid, size and sha256 of
//!   regular files, symlink target bytes, device major/minor, every xattr
//!   (name and value), mtime to the second of every path but the root
//!   directory (both tools set the times of files, symlinks and directories
//!   from the tar headers; the root's is left to the extraction), and hardlink
//!   groups (paths sharing an inode in one tree must share one in the other).
//!   Paths present in only one tree are differences too, so a dropped whiteout
//!   or opaque marker shows as an extra path.
//!
//! Both trees are extracted by root onto the same file system, so what that
//! file system adds or drops applies to both alike.
//!
//! Needs the test registry (`BERTH_TEST_ENV`, see tests/suite/common), root, and
//! skopeo, umoci and unsquashfs; without them the test prints why and passes,
//! unless `BERTH_REQUIRE_CLUSTER` is set.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr, OsString};
use std::fmt::Write as _;
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use sha2::{Digest, Sha256};

/// Most difference lines an assertion message shows.
const MAX_REPORTED: usize = 50;

/// One path of a tree, as compared.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    /// Regular files only.
    size: Option<u64>,
    /// Regular files only: sha256 of the content, hex.
    sha256: Option<String>,
    /// Symlinks only.
    target: Option<Vec<u8>>,
    /// Device nodes only: (major, minor).
    rdev: Option<(u32, u32)>,
    /// Every extended attribute, name to value.
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Seconds; `None` for the root directory.
    mtime: Option<i64>,
    /// (dev, ino) of non-directories, for the hardlink groups.
    inode: Option<(u64, u64)>,
}

/// A walked tree: path relative to its root (the root itself is `/`) to entry.
type Tree = BTreeMap<Vec<u8>, Entry>;

fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "directory"
    } else if ft.is_file() {
        "regular file"
    } else if ft.is_symlink() {
        "symlink"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_char_device() {
        "char device"
    } else if ft.is_fifo() {
        "fifo"
    } else if ft.is_socket() {
        "socket"
    } else {
        "unknown"
    }
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("path without NUL")
}

/// All extended attributes of `path` (not following a symlink).
fn xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let cpath = c_path(path);
    let mut out = BTreeMap::new();
    // SAFETY: a NULL buffer of size 0 asks for the needed size only.
    let len = unsafe { libc::llistxattr(cpath.as_ptr(), std::ptr::null_mut(), 0) };
    assert!(
        len >= 0,
        "llistxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    if len == 0 {
        return out;
    }
    let mut names = vec![0u8; len as usize];
    // SAFETY: the buffer holds `names.len()` bytes.
    let len = unsafe {
        libc::llistxattr(
            cpath.as_ptr(),
            names.as_mut_ptr().cast::<libc::c_char>(),
            names.len(),
        )
    };
    assert!(
        len >= 0,
        "llistxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    names.truncate(len as usize);
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cname = CString::new(name).unwrap();
        // SAFETY: as above, size query first.
        let size =
            unsafe { libc::lgetxattr(cpath.as_ptr(), cname.as_ptr(), std::ptr::null_mut(), 0) };
        assert!(
            size >= 0,
            "lgetxattr {} {}: {}",
            path.display(),
            String::from_utf8_lossy(name),
            std::io::Error::last_os_error()
        );
        let mut value = vec![0u8; size as usize];
        // SAFETY: the buffer holds `value.len()` bytes.
        let size = unsafe {
            libc::lgetxattr(
                cpath.as_ptr(),
                cname.as_ptr(),
                value.as_mut_ptr().cast::<libc::c_void>(),
                value.len(),
            )
        };
        assert!(
            size >= 0,
            "lgetxattr {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        value.truncate(size as usize);
        out.insert(name.to_vec(), value);
    }
    out
}

fn sha256_file(path: &Path) -> String {
    let mut file =
        std::fs::File::open(path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    hasher.finalize().iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn entry(path: &Path, is_root: bool) -> Entry {
    let meta = std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("cannot stat {}: {e}", path.display()));
    let ft = meta.file_type();
    let kind = kind_of(ft);
    let regular = ft.is_file();
    let device = ft.is_block_device() || ft.is_char_device();
    Entry {
        kind,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        size: regular.then(|| meta.size()),
        sha256: regular.then(|| sha256_file(path)),
        target: ft.is_symlink().then(|| {
            std::fs::read_link(path)
                .unwrap_or_else(|e| panic!("cannot readlink {}: {e}", path.display()))
                .into_os_string()
                .into_vec()
        }),
        rdev: device.then(|| {
            let rdev = meta.rdev() as libc::dev_t;
            (libc::major(rdev), libc::minor(rdev))
        }),
        xattrs: xattrs(path),
        mtime: (!is_root).then(|| meta.mtime()),
        inode: (!ft.is_dir()).then(|| (meta.dev(), meta.ino())),
    }
}

/// Walks `root` without following symlinks.
fn walk(root: &Path) -> Tree {
    let mut tree = Tree::new();
    tree.insert(b"/".to_vec(), entry(root, true));
    let mut stack: Vec<(PathBuf, Vec<u8>)> = vec![(root.to_path_buf(), Vec::new())];
    while let Some((dir, rel)) = stack.pop() {
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot read dir {}: {e}", dir.display()));
        for item in entries {
            let item = item.unwrap_or_else(|e| panic!("cannot read dir {}: {e}", dir.display()));
            let path = item.path();
            let mut name = rel.clone();
            name.push(b'/');
            name.extend_from_slice(item.file_name().as_bytes());
            let e = entry(&path, false);
            if e.kind == "directory" {
                stack.push((path, name.clone()));
            }
            tree.insert(name, e);
        }
    }
    tree
}

/// Each non-directory path that shares its inode with another path, mapped to
/// the first path (in byte order) of its group.
fn hardlink_groups(tree: &Tree) -> HashMap<&[u8], &[u8]> {
    let mut by_inode: HashMap<(u64, u64), Vec<&[u8]>> = HashMap::new();
    for (path, e) in tree {
        if let Some(ino) = e.inode {
            by_inode.entry(ino).or_default().push(path);
        }
    }
    let mut out = HashMap::new();
    for paths in by_inode.values().filter(|p| p.len() > 1) {
        // BTreeMap order: the first pushed is the least.
        for p in paths {
            out.insert(*p, paths[0]);
        }
    }
    out
}

fn show(bytes: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(bytes))
}

fn show_xattrs(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> String {
    let items: Vec<String> = x
        .iter()
        .map(|(k, v)| format!("{}={}", String::from_utf8_lossy(k), hex(v)))
        .collect();
    format!("{{{}}}", items.join(", "))
}

fn hex(v: &[u8]) -> String {
    v.iter().fold(String::from("0x"), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Every difference between the umoci tree and berth's, one line each.
fn differences(umoci: &Tree, berth: &Tree) -> Vec<String> {
    let mut out = Vec::new();
    for (path, u) in umoci {
        let p = show(path);
        let Some(b) = berth.get(path) else {
            out.push(format!("{p}: only in umoci's tree ({})", u.kind));
            continue;
        };
        let mut field = |name: &str, uv: String, bv: String| {
            if uv != bv {
                out.push(format!("{p}: {name}: umoci {uv}, berth {bv}"));
            }
        };
        field("type", u.kind.into(), b.kind.into());
        field("mode", format!("{:04o}", u.mode), format!("{:04o}", b.mode));
        field("uid", u.uid.to_string(), b.uid.to_string());
        field("gid", u.gid.to_string(), b.gid.to_string());
        field("size", format!("{:?}", u.size), format!("{:?}", b.size));
        field(
            "sha256",
            format!("{:?}", u.sha256),
            format!("{:?}", b.sha256),
        );
        field(
            "link target",
            format!("{:?}", u.target.as_deref().map(show)),
            format!("{:?}", b.target.as_deref().map(show)),
        );
        field("device", format!("{:?}", u.rdev), format!("{:?}", b.rdev));
        field("xattrs", show_xattrs(&u.xattrs), show_xattrs(&b.xattrs));
        field("mtime", format!("{:?}", u.mtime), format!("{:?}", b.mtime));
    }
    for (path, b) in berth {
        if !umoci.contains_key(path) {
            out.push(format!("{}: only in berth's tree ({})", show(path), b.kind));
        }
    }
    let (ug, bg) = (hardlink_groups(umoci), hardlink_groups(berth));
    for (path, u) in umoci {
        if u.inode.is_none() || !berth.contains_key(path) {
            continue;
        }
        let (uv, bv) = (ug.get(path.as_slice()), bg.get(path.as_slice()));
        if uv != bv {
            out.push(format!(
                "{}: hardlinked with: umoci {}, berth {}",
                show(path),
                uv.map_or("nothing".into(), |g| show(g)),
                bv.map_or("nothing".into(), |g| show(g)),
            ));
        }
    }
    out
}

/// Runs a command, panicking with its output unless it succeeds; returns stdout.
fn run(program: impl AsRef<OsStr>, args: &[&OsStr]) -> Vec<u8> {
    let program = program.as_ref();
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.to_string_lossy()));
    assert!(
        output.status.success(),
        "{} {:?} failed ({})\n--- stdout\n{}\n--- stderr\n{}",
        program.to_string_lossy(),
        args,
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// Why this test cannot run here, if it cannot.
fn missing_prerequisite() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (umoci unpack and unsquashfs keeping owners)".into());
    }
    for tool in ["skopeo", "umoci", "unsquashfs"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

/// The registry (`host:port`), or `None` (with a printed reason) when this
/// test cannot run here.
fn registry() -> Option<String> {
    let cluster = common::Cluster::get()?;
    if let Some(why) = missing_prerequisite() {
        if std::env::var("BERTH_REQUIRE_CLUSTER").is_ok() {
            panic!("BERTH_REQUIRE_CLUSTER is set but {why}");
        }
        eprintln!("skipped: {why}");
        return None;
    }
    Some(cluster.registry())
}

/// Pulls `name` (`NAME:TAG` in the test registry) both ways and asserts the
/// two trees are equal; returns umoci's tree.
fn check_image(registry: &str, name: &str) -> Tree {
    let reference = format!("{registry}/{name}");
    let tmp = tempfile::tempdir().unwrap();
    let t = |p: &str| tmp.path().join(p).into_os_string();
    let started = Instant::now();

    // berth's tree.
    let pulled = run(
        env!("CARGO_BIN_EXE_berth"),
        &[
            "pull".as_ref(),
            "--json".as_ref(),
            "--store".as_ref(),
            &t("store"),
            "--insecure-registry".as_ref(),
            registry.as_ref(),
            reference.as_ref(),
        ],
    );
    let stored: serde_json::Value = serde_json::from_slice(&pulled)
        .unwrap_or_else(|e| panic!("berth pull --json printed no JSON ({e}): {pulled:?}"));
    let squashfs = OsString::from(
        stored["squashfs"]
            .as_str()
            .unwrap_or_else(|| panic!("no squashfs in {stored}")),
    );
    let pull_time = started.elapsed();
    run(
        "unsquashfs",
        &[
            "-st".as_ref(),
            "-n".as_ref(),
            "-q".as_ref(),
            "-d".as_ref(),
            &t("berth"),
            &squashfs,
        ],
    );
    let berth_time = started.elapsed();

    // umoci's tree.
    let (_, tag) = name.rsplit_once(':').expect("NAME:TAG");
    let layout = format!("oci:{}:{tag}", tmp.path().join("oci").display());
    run(
        "skopeo",
        &[
            "copy".as_ref(),
            "-q".as_ref(),
            "--src-tls-verify=false".as_ref(),
            format!("docker://{reference}").as_ref(),
            layout.as_ref(),
        ],
    );
    let layout_ref = format!("{}:{tag}", tmp.path().join("oci").display());
    run(
        "umoci",
        &[
            "unpack".as_ref(),
            "--image".as_ref(),
            layout_ref.as_ref(),
            &t("bundle"),
        ],
    );
    let umoci_time = started.elapsed();

    let umoci_tree = walk(&tmp.path().join("bundle/rootfs"));
    let berth_tree = walk(&tmp.path().join("berth"));
    let diffs = differences(&umoci_tree, &berth_tree);
    eprintln!(
        "{name}: {} paths; berth pull {:.1}s + unsquashfs {:.1}s, skopeo + umoci {:.1}s, \
         walk and compare {:.1}s",
        umoci_tree.len(),
        pull_time.as_secs_f64(),
        (berth_time - pull_time).as_secs_f64(),
        (umoci_time - berth_time).as_secs_f64(),
        (started.elapsed() - umoci_time).as_secs_f64(),
    );
    assert!(
        umoci_tree.len() > 10,
        "umoci's tree of {name} is nearly empty"
    );
    let shown: Vec<&str> = diffs
        .iter()
        .take(MAX_REPORTED)
        .map(String::as_str)
        .collect();
    assert!(
        diffs.is_empty(),
        "{name}: berth's squashfs differs from umoci unpack in {} ways{}:\n{}",
        diffs.len(),
        if diffs.len() > MAX_REPORTED {
            format!(" (first {MAX_REPORTED} shown)")
        } else {
            String::new()
        },
        shown.join("\n")
    );
    umoci_tree
}

#[test]
fn busybox_equals_umoci_unpack() {
    if let Some(registry) = registry() {
        check_image(&registry, "busybox:latest");
    }
}

#[test]
fn debian_with_whiteouts_equals_umoci_unpack() {
    if let Some(registry) = registry() {
        let tree = check_image(&registry, "debian:bookworm");
        // The reference itself applied the whiteouts of tests/harness/images.sh.
        for gone in [
            "/etc/berth-whiteout-file",
            "/opt/berth-whiteout-dir",
            "/opt/berth-opaque/old-1",
            "/opt/berth-opaque-explicit/old-1",
        ] {
            assert!(!tree.contains_key(gone.as_bytes()), "umoci kept {gone}");
        }
    }
}

#[test]
fn openmpi_equals_umoci_unpack() {
    if let Some(registry) = registry() {
        check_image(&registry, "openmpi:bookworm");
    }
}

/// One entry of a hand-made layer.
enum Item<'a> {
    Dir(&'a str),
    File(&'a str, &'a str),
    Hard(&'a str, &'a str),
}

/// A gzip layer tar of `items` (owner 0, mtime fixed).
fn layer_tar(items: &[Item]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for item in items {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_size(0);
        match item {
            Item::Dir(p) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                b.append_data(&mut h, p, std::io::empty()).unwrap();
            }
            Item::File(p, data) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o644);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, p, data.as_bytes()).unwrap();
            }
            Item::Hard(p, target) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_mode(0o644);
                b.append_link(&mut h, p, target).unwrap();
            }
        }
    }
    let tar = b.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar).unwrap();
    gz.finish().unwrap()
}

/// Writes `bytes` as a blob of the OCI layout `dir`; returns its descriptor.
fn put_blob(dir: &Path, media_type: &str, bytes: &[u8]) -> serde_json::Value {
    let hex = format!("{:x}", Sha256::digest(bytes));
    std::fs::write(dir.join("blobs/sha256").join(&hex), bytes).unwrap();
    serde_json::json!({"mediaType": media_type, "digest": format!("sha256:{hex}"), "size": bytes.len()})
}

/// Pushes an image of `layers` (lowest first) to `registry` as `name` with
/// skopeo, from an OCI layout written here.
fn push_layers(registry: &str, name: &str, layers: &[Vec<u8>]) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let descs: Vec<_> = layers
        .iter()
        .map(|l| put_blob(dir, "application/vnd.oci.image.layer.v1.tar+gzip", l))
        .collect();
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|l| {
            let mut tar = Vec::new();
            flate2::read::GzDecoder::new(&l[..])
                .read_to_end(&mut tar)
                .unwrap();
            format!("sha256:{:x}", Sha256::digest(&tar))
        })
        .collect();
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids}
    });
    let config = put_blob(
        dir,
        "application/vnd.oci.image.config.v1+json",
        &serde_json::to_vec(&config).unwrap(),
    );
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config, "layers": descs
    });
    let mut manifest = put_blob(
        dir,
        "application/vnd.oci.image.manifest.v1+json",
        &serde_json::to_vec(&manifest).unwrap(),
    );
    manifest["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": "latest"});
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [manifest]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    run(
        "skopeo",
        &[
            "copy".as_ref(),
            "-q".as_ref(),
            "--dest-tls-verify=false".as_ref(),
            format!("oci:{}:latest", dir.display()).as_ref(),
            format!("docker://{registry}/{name}").as_ref(),
        ],
    );
}

/// The cases a one-pass, top-down conversion risks: hard links whose target a
/// later layer replaces (in its own layer and in a lower one), a directory
/// whited out and made again, an opaque directory with hard links inside.
#[test]
fn tricky_links_and_whiteouts_equal_umoci_unpack() {
    let Some(registry) = registry() else { return };
    use Item::*;
    let layers = [
        layer_tar(&[
            Dir("d"),
            File("d/f", "f in layer 0\n"),
            File("d/g", "g in layer 0\n"),
            Hard("d/g-link", "d/g"),
            Dir("w"),
            File("w/old", "old\n"),
            Dir("w/sub"),
            File("w/sub/deep", "deep\n"),
            Dir("o"),
            File("o/x", "x\n"),
            Hard("o/x-link", "o/x"),
        ]),
        layer_tar(&[
            Dir("d"),
            // A link to a file of a lower layer, replaced again in layer 2.
            Hard("d/f-link", "d/f"),
            File("d/g", "g in layer 1\n"),
            // The directory is deleted and made again in the same layer.
            File(".wh.w", ""),
            Dir("w"),
            File("w/new", "new\n"),
        ]),
        layer_tar(&[
            Dir("d"),
            File("d/f", "f in layer 2\n"),
            Dir("o"),
            File("o/.wh..wh..opq", ""),
            File("o/n", "n in layer 2\n"),
            Hard("o/n-link", "o/n"),
            Hard("o/n-link2", "o/n-link"),
        ]),
        layer_tar(&[Dir("o"), File("o/n", "n in layer 3\n")]),
    ];
    push_layers(&registry, "berth-tricky:latest", &layers);
    let tree = check_image(&registry, "berth-tricky:latest");
    for gone in ["/w/old", "/w/sub", "/o/x", "/o/x-link"] {
        assert!(!tree.contains_key(gone.as_bytes()), "umoci kept {gone}");
    }
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let (cpath, cname) = (c_path(path), CString::new(name).unwrap());
    // SAFETY: valid NUL-terminated strings and a buffer of `value.len()` bytes.
    let rc = unsafe {
        libc::lsetxattr(
            cpath.as_ptr(),
            cname.as_ptr(),
            value.as_ptr().cast::<libc::c_void>(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "lsetxattr {} {name}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// `security.capability` granting cap_net_raw (bit 13), effective: a
/// VFS_CAP_REVISION_2 record.
const CAP_NET_RAW_EP: [u8; 20] = [
    0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// The test images have no xattrs, no fifo and few odd modes; this one, built
/// here with umoci and pushed as `berth-umoci-synthetic:1`, has them all, so a
/// berth that drops any of them fails.
#[test]
fn synthetic_image_with_every_kind_of_entry_equals_umoci_unpack() {
    let Some(registry) = registry() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let bundle = tmp.path().join("bundle");
    let rootfs = bundle.join("rootfs");
    let sh = |script: &str| {
        run(
            "sh",
            &[
                "-euc".as_ref(),
                script.as_ref(),
                "sh".as_ref(),
                layout.as_os_str(),
                bundle.as_os_str(),
                registry.as_ref(),
            ],
        )
    };
    // Layer 1: files the next layer deletes, replaces or links to.
    sh(r#"L=$1 B=$2 r=$2/rootfs
        umoci init --layout "$L"
        umoci new --image "$L:1"
        umoci unpack --image "$L:1" "$B" >/dev/null
        mkdir -p "$r/etc" "$r/bin" "$r/opt/gone-dir/sub" "$r/opt/replaced" "$r/dev" "$r/run"
        printf 'lower
' >"$r/etc/gone"
        printf 'x
' >"$r/opt/gone-dir/sub/f"
        printf 'old
' >"$r/opt/replaced/old"
        printf 'layer 1 content
' >"$r/bin/replaced-later"
        ln "$r/bin/replaced-later" "$r/bin/link-to-replaced"
        printf 'suid
' >"$r/bin/suid-tool"
        chmod 4755 "$r/bin/suid-tool"
        ln "$r/bin/suid-tool" "$r/bin/suid-tool-link"
        umoci repack --image "$L:1" "$B" >/dev/null
    "#);
    // Layer 2: deletes, replacements, every entry type and mode, xattrs.
    sh(r#"r=$2/rootfs
        rm "$r/etc/gone"
        rm -r "$r/opt/gone-dir" "$r/opt/replaced"
        mkdir "$r/opt/replaced"
        printf 'new
' >"$r/opt/replaced/new"
        rm "$r/bin/replaced-later"
        printf 'layer 2 content
' >"$r/bin/replaced-later"
        mkdir -m 1777 "$r/tmp"
        mkdir -m 2775 "$r/srv"
        printf 'sgid
' >"$r/bin/sgid-tool"
        chmod 2711 "$r/bin/sgid-tool"
        printf 'secret
' >"$r/etc/secret"
        chmod 0400 "$r/etc/secret"
        printf 'none
' >"$r/etc/no-perms"
        chmod 0 "$r/etc/no-perms"
        printf 'owned
' >"$r/srv/owned"
        chown 1234:5678 "$r/srv/owned" "$r/srv"
        mknod -m 0666 "$r/dev/null" c 1 3
        mknod -m 0660 "$r/dev/loop200" b 7 200
        chown 0:6 "$r/dev/loop200"
        mkfifo -m 0620 "$r/run/fifo"
        ln -s ../bin/suid-tool "$r/etc/relative-link"
        ln -s /nonexistent/target "$r/etc/dangling-link"
        printf 'ping
' >"$r/bin/ping"
        printf 'xattrs
' >"$r/etc/with-xattrs"
        printf 'odd name
' >"$r/etc/name-$(printf 'ÿþ')"
        : >"$r/etc/empty"
    "#);
    set_xattr(
        &rootfs.join("bin/ping"),
        "security.capability",
        &CAP_NET_RAW_EP,
    );
    set_xattr(&rootfs.join("etc/with-xattrs"), "user.berth", b"value");
    set_xattr(
        &rootfs.join("etc/with-xattrs"),
        "trusted.berth",
        b"\x00\x01binary",
    );
    set_xattr(&rootfs.join("srv"), "user.berth-dir", b"on a directory");
    sh(r#"L=$1 B=$2
        umoci repack --image "$L:1" "$B" >/dev/null
        skopeo copy -q --dest-tls-verify=false "oci:$L:1" "docker://$3/berth-umoci-synthetic:1"
    "#);

    let tree = check_image(&registry, "berth-umoci-synthetic:1");
    // The reference has what this test is for, so equality means something.
    let get = |p: &str| {
        tree.get(p.as_bytes())
            .unwrap_or_else(|| panic!("umoci's tree has no {p}"))
    };
    assert_eq!(
        get("/bin/ping")
            .xattrs
            .get(b"security.capability".as_slice()),
        Some(&CAP_NET_RAW_EP.to_vec())
    );
    assert_eq!(get("/etc/with-xattrs").xattrs.len(), 2);
    assert_eq!(get("/srv").xattrs.len(), 1);
    assert_eq!(get("/bin/suid-tool").mode, 0o4755);
    assert_eq!(get("/tmp").mode, 0o1777);
    assert_eq!((get("/srv/owned").uid, get("/srv/owned").gid), (1234, 5678));
    assert_eq!(get("/dev/loop200").rdev, Some((7, 200)));
    assert_eq!(get("/run/fifo").kind, "fifo");
    assert_eq!(
        get("/bin/suid-tool").inode,
        get("/bin/suid-tool-link").inode
    );
    assert_ne!(
        get("/bin/replaced-later").sha256,
        get("/bin/link-to-replaced").sha256
    );
    for gone in ["/etc/gone", "/opt/gone-dir", "/opt/replaced/old"] {
        assert!(!tree.contains_key(gone.as_bytes()), "umoci kept {gone}");
    }
}

/// The comparison itself, on two small trees (no registry needed): each kind
/// of loss berth could cause is reported.
#[test]
fn comparison_reports_every_kind_of_difference() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let tmp = tempfile::tempdir().unwrap();
    for side in ["umoci", "berth"] {
        let r = tmp.path().join(side);
        std::fs::create_dir_all(r.join("d")).unwrap();
        std::fs::write(r.join("f"), "same").unwrap();
        std::fs::hard_link(r.join("f"), r.join("g")).unwrap();
        std::fs::write(r.join("h"), side).unwrap();
        symlink(if side == "umoci" { "f" } else { "g" }, r.join("l")).unwrap();
        let mode = if side == "umoci" { 0o4755 } else { 0o755 };
        std::fs::set_permissions(r.join("f"), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let (u, b) = (tmp.path().join("umoci"), tmp.path().join("berth"));
    set_xattr(&u.join("d"), "user.berth", b"v");
    std::fs::write(b.join("whiteout-dropped"), "").unwrap();
    std::fs::remove_file(b.join("g")).unwrap();
    std::fs::write(b.join("g"), "same").unwrap();
    std::fs::set_permissions(b.join("g"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    let diffs = differences(&walk(&u), &walk(&b)).join("\n");
    for expected in [
        "\"/f\": mode: umoci 4755, berth 0755",
        "\"/h\": size: umoci Some(5), berth Some(5)",
        "\"/h\": sha256:",
        "\"/l\": link target:",
        "\"/d\": xattrs: umoci {user.berth=0x76}, berth {}",
        "\"/whiteout-dropped\": only in berth's tree",
        "\"/g\": hardlinked with: umoci \"/f\", berth nothing",
    ] {
        if expected.contains("size") {
            // Same length on purpose: only the hash tells.
            assert!(!diffs.contains("\"/h\": size"), "{diffs}");
            continue;
        }
        assert!(diffs.contains(expected), "no {expected:?} in:\n{diffs}");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::lchown(b.join("h"), Some(1234), Some(5678)).unwrap();
        let diffs = differences(&walk(&u), &walk(&b)).join("\n");
        assert!(
            diffs.contains("\"/h\": uid: umoci 0, berth 1234"),
            "{diffs}"
        );
        assert!(
            diffs.contains("\"/h\": gid: umoci 0, berth 5678"),
            "{diffs}"
        );
    }
}
