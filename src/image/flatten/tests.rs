//! Flattening tests on small layer tars built in memory.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::Command;

use tar::{Archive, Builder, EntryType, Header};

use super::*;
use crate::image::squashfs::{convert, tar2sqfs_available, SquashfsOptions, SquashfsWriter};

/// One entry of a test layer.
enum E<'a> {
    File(&'a str, &'a str),
    Dir(&'a str),
    Sym(&'a str, &'a str),
    Hard(&'a str, &'a str),
    /// A file with a path written raw (no validation by the tar crate).
    RawFile(&'a [u8], &'a str),
    /// A file with mode and PAX records.
    Special(&'a str, u32, &'a [(&'a str, &'a [u8])]),
}

fn header(t: EntryType, mode: u32) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(t);
    h.set_mode(mode);
    h.set_uid(1000);
    h.set_gid(1000);
    h.set_mtime(1_700_000_000);
    h.set_size(0);
    h
}

fn tar_of(entries: &[E]) -> Vec<u8> {
    let mut b = Builder::new(Vec::new());
    for e in entries {
        match e {
            E::File(p, data) => {
                let mut h = header(EntryType::Regular, 0o644);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, p, data.as_bytes()).unwrap();
            }
            E::Dir(p) => {
                let mut h = header(EntryType::Directory, 0o755);
                b.append_data(&mut h, p, io::empty()).unwrap();
            }
            E::Sym(p, t) => {
                let mut h = header(EntryType::Symlink, 0o777);
                b.append_link(&mut h, p, t).unwrap();
            }
            E::Hard(p, t) => {
                let mut h = header(EntryType::Link, 0o644);
                b.append_link(&mut h, p, t).unwrap();
            }
            E::RawFile(p, data) => {
                let mut h = header(EntryType::Regular, 0o644);
                h.set_size(data.len() as u64);
                let name = &mut h.as_gnu_mut().unwrap().name;
                name.fill(0);
                name[..p.len()].copy_from_slice(p);
                h.set_cksum();
                b.append(&h, data.as_bytes()).unwrap();
            }
            E::Special(p, mode, pax) => {
                b.append_pax_extensions(pax.iter().copied()).unwrap();
                let mut h = header(EntryType::Regular, *mode);
                h.set_size(1);
                b.append_data(&mut h, p, &b"x"[..]).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

fn gz(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

fn layers(specs: &[&[E]]) -> Vec<Layer> {
    specs
        .iter()
        .enumerate()
        .map(|(i, entries)| {
            // Alternate gzip and plain tar: both must be accepted.
            let tar = tar_of(entries);
            let bytes = if i % 2 == 0 { gz(&tar) } else { tar };
            Layer::from_bytes(bytes, format!("layer{i}"))
        })
        .collect()
}

/// What the output tar holds at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Out {
    File(String),
    Dir,
    Sym(String),
    Hard(String),
}

fn flatten(specs: &[&[E]]) -> (BTreeMap<String, Out>, Flattened, Vec<u8>) {
    let layers = layers(specs);
    let mut tar = Vec::new();
    let plan = write_flattened(&layers, &mut tar, |_| {}).unwrap();
    let mut out = BTreeMap::new();
    let mut archive = Archive::new(&tar[..]);
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = String::from_utf8(entry.path_bytes().into_owned()).unwrap();
        let link = || String::from_utf8(entry.link_name_bytes().unwrap().into_owned()).unwrap();
        let value = match entry.header().entry_type() {
            EntryType::Directory => Out::Dir,
            EntryType::Symlink => Out::Sym(link()),
            EntryType::Link => Out::Hard(link()),
            _ => {
                let mut s = String::new();
                entry.read_to_string(&mut s).unwrap();
                Out::File(s)
            }
        };
        assert!(
            out.insert(path.clone(), value).is_none(),
            "duplicate {path}"
        );
    }
    (out, plan, tar)
}

fn file(s: &str) -> Out {
    Out::File(s.to_string())
}

fn keys(out: &BTreeMap<String, Out>) -> Vec<&str> {
    out.keys().map(String::as_str).collect()
}

#[test]
fn normalizes_paths() {
    assert_eq!(normalize(b"./a/b/").unwrap(), b"a/b");
    assert_eq!(normalize(b"/a//./b").unwrap(), b"a/b");
    assert_eq!(normalize(b"./").unwrap(), b"");
    assert!(normalize(b"a/../b").is_err());
    assert!(normalize(b"..").is_err());
    assert!(normalize(b"a\0b").is_err());
}

#[test]
fn later_layers_win() {
    let (out, _, _) = flatten(&[
        &[E::Dir("etc"), E::File("etc/a", "1"), E::File("etc/b", "1")],
        &[E::File("etc/a", "2")],
    ]);
    assert_eq!(out["etc/a"], file("2"));
    assert_eq!(out["etc/b"], file("1"));
    assert_eq!(out["etc"], Out::Dir);
}

#[test]
fn whiteout_file() {
    let (out, _, _) = flatten(&[
        &[E::Dir("a"), E::File("a/x", "x"), E::File("a/y", "y")],
        &[E::Dir("a"), E::File("a/.wh.x", "")],
    ]);
    assert_eq!(keys(&out), ["a", "a/y"]);
}

#[test]
fn whiteout_folder() {
    let (out, _, _) = flatten(&[
        &[
            E::Dir("d"),
            E::Dir("d/sub"),
            E::File("d/sub/f", "f"),
            E::File("keep", "k"),
        ],
        &[E::File(".wh.d", "")],
    ]);
    assert_eq!(keys(&out), ["keep"]);
}

#[test]
fn whiteout_applies_to_lower_layers_only() {
    // The whiteout comes after the same layer's new file in the tar: the new file stays.
    let (out, _, _) = flatten(&[
        &[E::File("f", "old")],
        &[E::File("f", "new"), E::File(".wh.f", "")],
    ]);
    assert_eq!(out["f"], file("new"));
}

#[test]
fn opaque_directory() {
    let (out, _, _) = flatten(&[
        &[
            E::Dir("d"),
            E::File("d/a", "a"),
            E::Dir("d/s"),
            E::File("d/s/b", "b"),
        ],
        &[
            E::Dir("d"),
            E::File("d/c", "c"),
            E::File("d/.wh..wh..opq", ""),
        ],
    ]);
    assert_eq!(keys(&out), ["d", "d/c"]);
}

#[test]
fn file_replaced_by_dir_and_dir_by_file() {
    let (out, _, _) = flatten(&[
        &[E::File("p", "file"), E::Dir("q"), E::File("q/inner", "i")],
        &[
            E::Dir("p"),
            E::File("p/child", "c"),
            E::File("q", "now a file"),
        ],
    ]);
    assert_eq!(out["p"], Out::Dir);
    assert_eq!(out["p/child"], file("c"));
    assert_eq!(out["q"], file("now a file"));
    assert!(!out.contains_key("q/inner"));
}

#[test]
fn implicit_parent_replaces_lower_file() {
    let (out, plan, _) = flatten(&[&[E::File("p", "file")], &[E::File("p/q", "q")]]);
    assert_eq!(out["p"], Out::Dir);
    assert_eq!(out["p/q"], file("q"));
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
}

#[test]
fn unsafe_paths_are_rejected() {
    let (out, plan, _) = flatten(&[&[
        E::RawFile(b"../evil", "e"),
        E::RawFile(b"a/../../evil2", "e"),
        E::RawFile(b"/abs/file", "abs"),
        E::File("ok", "ok"),
        E::Hard("h", "../etc/shadow"),
    ]]);
    // Absolute paths are confined to the image; `..` never gets through.
    assert_eq!(keys(&out), ["abs", "abs/file", "ok"]);
    assert_eq!(out["abs/file"], file("abs"));
    let w = plan.warnings.join("\n");
    assert!(
        w.contains("../evil") && w.contains("evil2") && w.contains("shadow"),
        "{w}"
    );
}

#[test]
fn directory_headers_in_any_order() {
    let (out, _, _) = flatten(&[
        &[E::File("a/b/c", "c"), E::Dir("a/b"), E::Dir("a")],
        &[E::File("x/y", "y")],
    ]);
    assert_eq!(keys(&out), ["a", "a/b", "a/b/c", "x", "x/y"]);
    assert_eq!(out["x"], Out::Dir);
}

#[test]
fn whiteout_files_never_appear() {
    let (out, _, _) = flatten(&[&[
        E::File(".wh.nothing", ""),
        E::Dir("d"),
        E::File("d/.wh..wh..opq", ""),
        E::File("d/.wh..wh.plnk", ""),
    ]]);
    assert_eq!(keys(&out), ["d"]);
}

#[test]
fn symlinks_are_not_followed() {
    // A symlink pointing outside and a later entry "through" it: the entry
    // replaces the symlink by a directory inside the image.
    let (out, _, _) = flatten(&[
        &[
            E::Sym("lib", "/etc"),
            E::Sym("abs", "../../../../etc/passwd"),
        ],
        &[E::File("lib/x", "x")],
    ]);
    assert_eq!(out["lib"], Out::Dir);
    assert_eq!(out["lib/x"], file("x"));
    assert_eq!(out["abs"], Out::Sym("../../../../etc/passwd".into()));
}

#[test]
fn hardlinks() {
    let (out, plan, _) = flatten(&[
        &[
            E::File("f", "orig"),
            E::Hard("l1", "f"),
            E::Hard("l2", "./f"),
            E::Hard("chain", "l1"),
            E::File("g", "g"),
            E::Hard("lg", "g"),
            E::Dir("dir"),
            E::Hard("ldir", "dir"),
            E::Hard("missing", "nope"),
        ],
        // f is replaced and g deleted: their links keep the old content.
        &[E::File("f", "new"), E::File(".wh.g", "")],
    ]);
    assert_eq!(out["f"], file("new"));
    assert_eq!(out["l1"], file("orig"));
    assert_eq!(out["l2"], Out::Hard("l1".into()));
    assert_eq!(out["chain"], Out::Hard("l1".into()));
    assert_eq!(out["lg"], file("g"));
    assert!(!out.contains_key("g") && !out.contains_key("ldir") && !out.contains_key("missing"));
    let w = plan.warnings.join("\n");
    assert!(w.contains("/ldir") && w.contains("/missing"), "{w}");

    let (out, _, _) = flatten(&[&[E::File("f", "x"), E::Hard("l", "f")]]);
    assert_eq!(out["l"], Out::Hard("f".into()));
}

#[test]
fn metadata_is_preserved() {
    let long = format!("{}/file", "d".repeat(150));
    let (_, _, tar) = flatten(&[&[
        E::Special(
            "suid",
            0o4755,
            &[("SCHILY.xattr.security.capability", b"\x01\x02")],
        ),
        E::Special("sticky", 0o1777, &[]),
        E::File(&long, "long"),
    ]]);
    let mut archive = Archive::new(&tar[..]);
    let mut seen = BTreeMap::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = String::from_utf8(entry.path_bytes().into_owned()).unwrap();
        let h = entry.header().clone();
        let xattr = entry
            .pax_extensions()
            .unwrap()
            .map(|exts| {
                exts.filter_map(Result::ok)
                    .any(|e| e.key() == Ok("SCHILY.xattr.security.capability"))
            })
            .unwrap_or(false);
        seen.insert(
            path,
            (
                h.mode().unwrap(),
                h.uid().unwrap(),
                h.mtime().unwrap(),
                xattr,
            ),
        );
    }
    assert_eq!(seen["suid"], (0o4755, 1000, 1_700_000_000, true));
    assert_eq!(seen["sticky"].0, 0o1777);
    assert!(seen.contains_key(&long));
}

#[test]
fn corrupt_layer_is_an_error_naming_it() {
    let mut tar = tar_of(&[E::File("a", "a")]);
    tar[0] = b'\xff';
    tar[148] = b'x'; // checksum field
    let layers = vec![Layer::from_bytes(gz(&tar), "sha256:bad")];
    let err = write_flattened(&layers, io::sink(), |_| {}).unwrap_err();
    assert!(format!("{err:#}").contains("sha256:bad"), "{err:#}");
}

/// End to end: two layers through tar2sqfs, listed with `unsquashfs -lln`
/// (`-lls` with numeric owners).
#[test]
fn converts_to_squashfs() {
    if (!tar2sqfs_available() || Command::new("unsquashfs").arg("-h").output().is_err())
        && crate::test_support::skip_because(
            "converts_to_squashfs",
            "tar2sqfs or unsquashfs is not installed (apt-get install squashfs-tools-ng squashfs-tools)",
        )
    {
        return;
    }
    let layers = layers(&[
        &[
            E::Dir("etc"),
            E::File("etc/keep", "k"),
            E::File("etc/gone", "g"),
            E::Special("usr/bin/sudo", 0o4755, &[]),
            E::Sym("bin", "usr/bin"),
            E::File("f", "orig"),
            E::Hard("f2", "f"),
        ],
        &[
            E::File("etc/.wh.gone", ""),
            E::File("f", "new"),
            E::File("usr/bin/tool", "t"),
        ],
    ]);
    // berth's own writer and tar2sqfs give the same tree.
    let builtin = converted_listing(&layers, SquashfsWriter::Builtin);
    let tar2sqfs = converted_listing(&layers, SquashfsWriter::Tar2sqfs);
    assert_eq!(builtin, tar2sqfs);
}

/// Converts `layers` with `writer`, checks the image, returns its listing.
fn converted_listing(layers: &[Layer], writer: SquashfsWriter) -> String {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("image.sqfs");
    let options = SquashfsOptions {
        writer,
        ..SquashfsOptions::default()
    };
    let stats = convert(layers, &dest, &options).unwrap();
    assert!(stats.image_size > 0 && stats.paths >= 8, "{stats:?}");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["image.sqfs"], "no temp file left");
    let listing = Command::new("unsquashfs")
        .arg("-lln")
        .arg(&dest)
        .output()
        .unwrap();
    assert!(listing.status.success());
    let listing = String::from_utf8_lossy(&listing.stdout);
    let line = |p: &str| {
        listing
            .lines()
            .find(|l| {
                l.ends_with(&format!("squashfs-root/{p}"))
                    || l.contains(&format!("squashfs-root/{p} -> "))
            })
            .unwrap_or_else(|| panic!("{p} missing in:\n{listing}"))
            .to_string()
    };
    assert!(
        line("etc/keep").starts_with("-rw-r--r-- 1000/1000"),
        "{listing}"
    );
    assert!(line("usr/bin/sudo").starts_with("-rwsr-xr-x"), "{listing}");
    assert!(line("bin").starts_with('l'), "{listing}");
    assert!(line("usr/bin/tool").starts_with('-'));
    assert!(line("f2").starts_with('-'));
    assert!(
        !listing.contains("etc/gone") && !listing.contains(".wh."),
        "{listing}"
    );

    // Content check through unsquashfs -cat.
    let cat = |p: &str| {
        let o = Command::new("unsquashfs")
            .arg("-cat")
            .arg(&dest)
            .arg(p)
            .output()
            .unwrap();
        String::from_utf8(o.stdout).unwrap()
    };
    assert_eq!(cat("f"), "new");
    assert_eq!(cat("f2"), "orig");
    listing.into_owned()
}

#[test]
fn whiteout_of_a_dir_then_recreated() {
    // The upper layer deletes d and makes it again: only the new children stay.
    let (out, _, _) = flatten(&[
        &[
            E::Dir("d"),
            E::File("d/old", "o"),
            E::Dir("d/sub"),
            E::File("d/sub/x", "x"),
        ],
        &[E::File(".wh.d", ""), E::Dir("d"), E::File("d/new", "n")],
        &[E::File("d/top", "t")],
    ]);
    assert_eq!(keys(&out), ["d", "d/new", "d/top"]);
}

#[test]
fn opaque_dir_with_hardlinks() {
    // Links inside an opaque directory to files of the same layer stay links;
    // a link to a file the opaque marker hides keeps the hidden content.
    let (out, plan, _) = flatten(&[
        &[
            E::Dir("d"),
            E::File("d/lib", "old"),
            E::Hard("d/liblink", "d/lib"),
        ],
        &[
            E::Dir("d"),
            E::File("d/.wh..wh..opq", ""),
            E::File("d/new", "n"),
            E::Hard("d/newlink", "d/new"),
        ],
    ]);
    assert_eq!(keys(&out), ["d", "d/new", "d/newlink"]);
    assert_eq!(out["d/newlink"], Out::Hard("d/new".into()));
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);

    let (out, _, _) = flatten(&[
        &[E::File("f", "base")],
        &[E::File("f", "mid"), E::Hard("keep", "f")],
        &[E::File(".wh.f", "")],
    ]);
    assert_eq!(keys(&out), ["keep"]);
    assert_eq!(out["keep"], file("mid"));
}

#[test]
fn hardlink_to_a_lower_layer() {
    // The link's layer does not hold its target: it names the lower file.
    let (out, _, _) = flatten(&[&[E::File("f", "low")], &[E::Hard("l", "f")]]);
    assert_eq!(out["f"], file("low"));
    assert_eq!(out["l"], Out::Hard("f".into()));
    // The lower file is replaced above the link: the link keeps the old content.
    let (out, _, _) = flatten(&[
        &[E::File("f", "low")],
        &[E::Hard("l", "f")],
        &[E::File("f", "top")],
    ]);
    assert_eq!(out["f"], file("top"));
    assert_eq!(out["l"], file("low"));
}

#[test]
fn hidden_entries_still_hide_lower_layers() {
    // A middle-layer file at p (hidden by the top layer's p/q) still removed
    // the bottom layer's directory p and its children.
    let (out, _, _) = flatten(&[
        &[E::Dir("p"), E::File("p/old", "o")],
        &[E::File("p", "file")],
        &[E::File("p/q", "q")],
    ]);
    assert_eq!(keys(&out), ["p", "p/q"]);
    // A middle entry below a whited-out path still makes its parent a directory.
    let (out, _, _) = flatten(&[
        &[E::File("a", "file")],
        &[E::File("a/b/c", "c")],
        &[E::File("a/.wh.b", "")],
    ]);
    assert_eq!(keys(&out), ["a"]);
    assert_eq!(out["a"], Out::Dir);
    // A top-level opaque marker hides every lower entry.
    let (out, _, _) = flatten(&[
        &[E::File("x", "x")],
        &[E::File(".wh..wh..opq", ""), E::File("y", "y")],
    ]);
    assert_eq!(keys(&out), ["y"]);
}

#[test]
fn a_second_entry_in_one_layer_is_skipped() {
    let (out, plan, _) = flatten(&[&[
        E::File("f", "one"),
        E::File("f", "two"),
        E::Dir("d"),
        E::Dir("d"),
    ]]);
    assert_eq!(out["f"], file("one"));
    assert!(
        plan.warnings.join("\n").contains("second entry for /f"),
        "{:?}",
        plan.warnings
    );
    assert_eq!(plan.warnings.len(), 1, "{:?}", plan.warnings);
}

#[test]
fn layers_are_read_once_without_lost_link_targets() {
    let (_, plan, _) = flatten(&[
        &[E::File("f", "x"), E::Hard("l", "f")],
        &[E::File("g", "y")],
    ]);
    assert_eq!(plan.reread_layers, 0);
    // The target is replaced above: its old content is kept in memory for
    // the link of its own layer and for the link of an upper layer.
    let (out, plan, _) = flatten(&[
        &[E::File("f", "x"), E::Hard("l", "f")],
        &[E::File("f", "y"), E::Hard("m", "l")],
        &[E::File("f", "z")],
    ]);
    assert_eq!(plan.reread_layers, 0);
    assert_eq!(out["l"], file("x"));
    assert_eq!(out["f"], file("z"));
    assert_eq!(out["m"], Out::Hard("l".to_string()), "{out:?}");
    // A target too large to keep is read again at the end.
    let big: &'static str = "b".repeat((1 << 20) + 1).leak();
    let (out, plan, _) = flatten(&[
        &[E::File("f", big), E::Hard("l", "f")],
        &[E::File("f", "y")],
    ]);
    assert_eq!(plan.reread_layers, 1);
    assert_eq!(out["l"], file(big));
}

/// Flattens the layer files in `BERTH_FLATTEN_LAYERS` (colon-separated,
/// lowest first) to `BERTH_FLATTEN_OUT` (or nowhere) and prints the paths
/// and the process's peak memory: `cargo test --release --lib
/// flattens_layer_files -- --ignored --nocapture`, for measuring.
#[test]
#[ignore]
fn flattens_layer_files_from_the_environment() {
    let files = std::env::var("BERTH_FLATTEN_LAYERS").expect("BERTH_FLATTEN_LAYERS");
    let layers: Vec<Layer> = files
        .split(':')
        .map(|f| Layer::from_file(f.into(), f))
        .collect();
    let out: Box<dyn Write> = match std::env::var_os("BERTH_FLATTEN_OUT") {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).unwrap(),
        )),
        None => Box::new(std::io::sink()),
    };
    let start = std::time::Instant::now();
    let done = write_flattened(&layers, out, |_| {}).unwrap();
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let peak = status.lines().find(|l| l.starts_with("VmHWM")).unwrap();
    println!(
        "{} paths, {} entries, {} layers read again, {:.2} s, {peak}",
        done.paths,
        done.entries,
        done.reread_layers,
        start.elapsed().as_secs_f64()
    );
}
