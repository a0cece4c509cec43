//! Tests of [`super`]: enroot's layout as `enroot import` leaves it, berth's
//! JSON, and the round trip of what `--container-save` writes.

use std::collections::HashMap;

use super::*;

/// An `/etc/rc` in the shape `enroot import` gives it (checked against
/// enroot 4.1 output of an image with these settings).
const ENROOT_RC_TEXT: &str = r#"# enroot-provenance: docker://registry.example#team/app:1
# org.opencontainers.image.title app
# berth.mpi mpich

mkdir -p "/srv/app" 2> /dev/null
cd "/srv/app" && unset OLDPWD || exit 1

if [ -s /etc/rc.local ]; then
    . /etc/rc.local
fi

if [ $# -gt 0 ]; then
    exec '/usr/bin/tini' '--' 'it'\''s' "$@"
else
    exec '/usr/bin/tini' '--' 'it'\''s' 'python3' $'-c\nprint(1)'
fi
"#;

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn reader(files: &[(&str, &[u8])]) -> impl FnMut(&str) -> Option<Vec<u8>> {
    let files: HashMap<String, Vec<u8>> = files
        .iter()
        .map(|(p, b)| (p.to_string(), b.to_vec()))
        .collect();
    move |path| files.get(path).cloned()
}

#[test]
fn reads_an_enroot_imported_root() {
    let environment = b"PATH=/opt/app/bin:/usr/bin\n  # a comment\n\nLANG=\"C.UTF-8\"\nENROOT_X=1\nnot a variable\nEMPTY=\n";
    let found = read(reader(&[
        (ENROOT_RC, ENROOT_RC_TEXT.as_bytes()),
        (ENROOT_ENVIRONMENT, environment),
    ]));
    assert_eq!(found.source, Some(ENROOT_RC));
    assert!(found.notes.is_empty(), "{:?}", found.notes);
    let config = found.config.unwrap();
    assert_eq!(
        config.env,
        ["PATH=/opt/app/bin:/usr/bin", "LANG=C.UTF-8", "EMPTY="]
    );
    assert_eq!(config.working_dir.as_deref(), Some("/srv/app"));
    assert_eq!(
        config.entrypoint,
        Some(strings(&["/usr/bin/tini", "--", "it's"]))
    );
    assert_eq!(config.cmd, Some(strings(&["python3", "-c\nprint(1)"])));
    assert_eq!(config.labels["org.opencontainers.image.title"], "app");
    assert_eq!(config.labels["berth.mpi"], "mpich");
    assert_eq!(config.labels.len(), 2);
}

#[test]
fn an_image_without_entrypoint_and_workdir_reads_as_enroot_wrote_it() {
    let rc = "# enroot-provenance: docker://x\n\nmkdir -p \"/\" 2> /dev/null\ncd \"/\" && unset OLDPWD || exit 1\n\nif [ $# -gt 0 ]; then\n    exec  \"$@\"\nelse\n    exec  '/bin/sh'\nfi\n";
    let found = read(reader(&[(ENROOT_RC, rc.as_bytes())]));
    let config = found.config.unwrap();
    assert!(found.notes.is_empty(), "{:?}", found.notes);
    assert_eq!(config.working_dir, None);
    assert_eq!(config.entrypoint, None);
    assert_eq!(config.cmd, Some(strings(&["/bin/sh"])));
    assert!(config.env.is_empty());
}

#[test]
fn a_script_of_another_shape_is_named_in_a_note() {
    let rc = "#!/bin/sh\nexec \"$MYAPP\" \"$@\"\n";
    let found = read(reader(&[(ENROOT_RC, rc.as_bytes())]));
    let config = found.config.unwrap();
    assert_eq!(config.entrypoint, None);
    let notes = found.notes.join("\n");
    assert!(notes.contains("cannot read `exec \"$MYAPP\""), "{notes}");
    assert!(
        notes.contains("ENTRYPOINT and CMD are not known"),
        "{notes}"
    );
}

#[test]
fn berths_place_comes_first() {
    let json = br#"{"config":{"Env":["A=1"],"WorkingDir":"/w","Entrypoint":["/e"],"Cmd":null}}"#;
    let found = read(reader(&[
        (BERTH_CONFIG, json),
        (ENROOT_RC, ENROOT_RC_TEXT.as_bytes()),
        (ENROOT_ENVIRONMENT, b"B=2\n"),
    ]));
    assert_eq!(found.source, Some(BERTH_CONFIG));
    let config = found.config.unwrap();
    assert_eq!(config.env, ["A=1"]);
    assert_eq!(config.working_dir.as_deref(), Some("/w"));
    assert_eq!(config.entrypoint, Some(strings(&["/e"])));
}

#[test]
fn a_broken_berth_config_falls_back_to_enroots_with_a_note() {
    let found = read(reader(&[
        (BERTH_CONFIG, b"{not json"),
        (ENROOT_RC, ENROOT_RC_TEXT.as_bytes()),
    ]));
    assert_eq!(found.source, Some(ENROOT_RC));
    assert!(found.notes[0].contains(BERTH_CONFIG), "{:?}", found.notes);
}

#[test]
fn a_plain_root_carries_nothing() {
    let found = read(reader(&[(ENROOT_ENVIRONMENT, b"PATH=/x\n")]));
    assert_eq!(found, Found::default());
}

#[test]
fn saved_files_read_back_in_both_places() {
    let config = ImageConfig {
        env: strings(&["PATH=/opt/x/bin:/usr/bin", "Q=it's \"q\" $HOME", "NL=a\nb"]),
        working_dir: Some("/work dir/$x".into()),
        entrypoint: Some(strings(&["/entry point", "--flag='v'"])),
        cmd: Some(strings(&["run", ""])),
        user: Some("1000".into()),
        labels: [("k.v".to_string(), "a\nb".to_string())].into(),
    };
    let (files, notes) = files(&config);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].starts_with("NL has a line break"), "{notes:?}");
    let by_path = |path: &str| {
        files
            .iter()
            .find(|f| f.path == path)
            .map(|f| f.bytes.clone())
    };
    let berth = read(|p| by_path(p));
    assert_eq!(berth.source, Some(BERTH_CONFIG));
    assert_eq!(berth.config.as_ref(), Some(&config));

    let enroot = read(|p| by_path(p).filter(|_| p != BERTH_CONFIG));
    assert_eq!(enroot.source, Some(ENROOT_RC));
    assert!(enroot.notes.is_empty(), "{:?}", enroot.notes);
    let got = enroot.config.unwrap();
    assert_eq!(got.env, config.env[..2]);
    assert_eq!(got.working_dir, config.working_dir);
    assert_eq!(got.entrypoint, config.entrypoint);
    assert_eq!(got.cmd, config.cmd);
    assert_eq!(got.labels["k.v"], "a b");
}

#[test]
fn saved_rc_runs_in_sh_as_enroot_would() {
    let config = ImageConfig {
        working_dir: Some("/".into()),
        entrypoint: Some(strings(&["printf", "<%s>"])),
        cmd: Some(strings(&["it's", "a b"])),
        ..ImageConfig::default()
    };
    let (files, _) = files(&config);
    let rc = files.iter().find(|f| f.path == ENROOT_RC).unwrap();
    let script = String::from_utf8(rc.bytes.clone())
        .unwrap()
        .replace("/etc/rc.local", "/nonexistent/rc.local");
    let run = |args: &[&str]| {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .arg("rc")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(run(&[]), "<it's><a b>");
    assert_eq!(run(&["x y", "z"]), "<x y><z>");
}
