//! Tests of archive reading: both formats, links, and hostile archives.

use std::io::Write;

use super::*;

/// A tar of one file `f` holding `body`, as a layer.
fn layer_tar(body: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_size(body.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "f", body).unwrap();
    b.into_inner().unwrap()
}

const CONFIG: &str =
    r#"{"config":{"Env":["A=1"],"WorkingDir":"/w","Entrypoint":["/e"],"Cmd":["c"]}}"#;

/// Builds an archive from `(path, body)` files and `(path, target)` symlinks.
fn archive(files: &[(&str, &[u8])], links: &[(&str, &str)]) -> tempfile::NamedTempFile {
    let mut b = tar::Builder::new(Vec::new());
    for (path, body) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        // set_path refuses '..'; hostile names go in raw.
        let name = h.as_old_mut().name.as_mut();
        name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_cksum();
        b.append(&h, *body).unwrap();
    }
    for (path, target) in links {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        let name = h.as_old_mut().name.as_mut();
        name[..path.len()].copy_from_slice(path.as_bytes());
        let link = h.as_old_mut().linkname.as_mut();
        link[..target.len()].copy_from_slice(target.as_bytes());
        h.set_cksum();
        b.append(&h, &[][..]).unwrap();
    }
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(&b.into_inner().unwrap()).unwrap();
    file
}

fn read_layer(layer: &Layer) -> Vec<u8> {
    let mut out = Vec::new();
    layer.open_tar().unwrap().read_to_end(&mut out).unwrap();
    out
}

fn error_of(file: &tempfile::NamedTempFile) -> String {
    match read(file.path(), "/home/u/x.tar") {
        Ok(_) => panic!("the archive was accepted"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn a_docker_archive_gives_its_config_and_layers_following_links() {
    let one = layer_tar(b"one");
    let two = layer_tar(b"two");
    let manifest = br#"[{"Config":"c.json","RepoTags":["x:1"],"Layers":["a/layer.tar","b/layer.tar","c/layer.tar"]}]"#;
    let file = archive(
        &[
            ("manifest.json", manifest),
            ("c.json", CONFIG.as_bytes()),
            ("./a/layer.tar", &one),
            ("b/layer.tar", &two),
        ],
        // docker's legacy format links a repeated layer to its first copy.
        &[("c/layer.tar", "../a/layer.tar")],
    );
    let image = read(file.path(), "x.tar").unwrap();
    assert_eq!(image.config.env, vec!["A=1".to_string()]);
    assert_eq!(image.config.working_dir.as_deref(), Some("/w"));
    assert_eq!(image.config.entrypoint, Some(vec!["/e".to_string()]));
    assert_eq!(image.config.cmd, Some(vec!["c".to_string()]));
    assert_eq!(image.layers.len(), 3);
    assert_eq!(read_layer(&image.layers[0]), one);
    assert_eq!(read_layer(&image.layers[1]), two);
    assert_eq!(read_layer(&image.layers[2]), one);
}

#[test]
fn an_oci_archive_goes_from_the_index_to_the_manifest() {
    let one = layer_tar(b"one");
    let blob = |bytes: &[u8]| Digest::of_bytes(bytes);
    let config = blob(CONFIG.as_bytes());
    let layer = blob(&one);
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",
        "config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config}","size":1}},
        "layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{layer}","size":1}}]}}"#
    );
    let manifest_digest = blob(manifest.as_bytes());
    let index = format!(
        r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json",
        "digest":"{manifest_digest}","size":1}}]}}"#
    );
    let path = |d: &Digest| format!("blobs/sha256/{}", d.hex());
    let file = archive(
        &[
            ("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#),
            ("index.json", index.as_bytes()),
            (&path(&manifest_digest), manifest.as_bytes()),
            (&path(&config), CONFIG.as_bytes()),
            (&path(&layer), &one),
        ],
        &[],
    );
    let image = read(file.path(), "x.tar").unwrap();
    assert_eq!(image.config.cmd, Some(vec!["c".to_string()]));
    assert_eq!(image.layers.len(), 1);
    assert_eq!(read_layer(&image.layers[0]), one);
}

#[test]
fn a_path_leading_out_of_the_archive_is_refused_by_name() {
    let file = archive(&[("../../etc/evil", b"x"), ("manifest.json", b"[]")], &[]);
    let e = error_of(&file);
    assert!(e.contains("/home/u/x.tar"), "{e}");
    assert!(e.contains("../../etc/evil"), "{e}");
    let file = archive(&[("/etc/evil", b"x")], &[]);
    assert!(error_of(&file).contains("absolute"));
}

#[test]
fn a_link_leading_out_of_the_archive_is_refused_by_name() {
    let manifest = br#"[{"Config":"c.json","Layers":["a/layer.tar"]}]"#;
    let file = archive(
        &[("manifest.json", manifest), ("c.json", CONFIG.as_bytes())],
        &[("a/layer.tar", "../../etc/shadow")],
    );
    let e = error_of(&file);
    assert!(e.contains("a/layer.tar"), "{e}");
    assert!(e.contains("leaves the archive"), "{e}");
    let file = archive(
        &[("manifest.json", manifest), ("c.json", CONFIG.as_bytes())],
        &[("a/layer.tar", "/etc/shadow")],
    );
    assert!(error_of(&file).contains("leaves the archive"));
}

#[test]
fn an_oversized_manifest_is_refused_by_name() {
    let big = vec![b' '; MAX_JSON as usize + 1];
    let file = archive(&[("manifest.json", &big)], &[]);
    let e = error_of(&file);
    assert!(e.contains("manifest.json"), "{e}");
    assert!(e.contains("more than"), "{e}");
}

#[test]
fn a_tar_that_is_no_image_archive_says_how_to_make_one() {
    let file = archive(&[("hello.txt", b"hi")], &[]);
    assert!(error_of(&file).contains("docker save"));
    let manifest = br#"[{"Config":"c.json","Layers":["missing.tar"]}]"#;
    let file = archive(
        &[("manifest.json", manifest), ("c.json", CONFIG.as_bytes())],
        &[],
    );
    assert!(error_of(&file).contains("does not hold"));
}

#[test]
fn tar_headers_are_told_from_squashfs() {
    assert!(is_tar(&layer_tar(b"x")));
    let mut sqfs = b"hsqs".to_vec();
    sqfs.resize(512, 0);
    assert!(!is_tar(&sqfs));
}
