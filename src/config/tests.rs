//! Unit tests of the configuration: defaults, files, the plugstack line, every key.

use super::*;

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn plugstack_args_override_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("berth.conf");
    std::fs::write(
        &file,
        "# site\nstore_path=/nvme/berth\ninsecure_registries=a:5000\n",
    )
    .unwrap();
    let config = Config::from_plugstack_args(&args(&[
        &format!("config={}", file.display()),
        "insecure_registries=b:1, c",
        "execute_entrypoint=yes",
    ]))
    .unwrap();
    assert_eq!(config.store_path, PathBuf::from("/nvme/berth"));
    assert_eq!(config.insecure_registries, vec!["b:1", "c"]);
    assert!(config.execute_entrypoint);
    assert_eq!(config.log_level, LogLevel::Info);
    assert!(config.sbatch_support);
    let config =
        Config::from_plugstack_args(&args(&["log_level=DEBUG", "sbatch_support=0"])).unwrap();
    assert_eq!(config.log_level, LogLevel::Debug);
    assert!(!config.sbatch_support);
    assert!(LogLevel::Error < LogLevel::Info && LogLevel::Verbose < LogLevel::Debug);
}

#[test]
fn unknown_and_malformed_arguments_are_named() {
    let e = Config::from_plugstack_args(&args(&["bogus=1"])).unwrap_err();
    assert!(e.to_string().contains("unknown argument `bogus`"), "{e}");
    let e = Config::from_plugstack_args(&args(&["store_path=relative"])).unwrap_err();
    assert!(e.to_string().contains("absolute path"), "{e}");
    let e = Config::from_plugstack_args(&args(&["novalue"])).unwrap_err();
    assert!(e.to_string().contains("not key=value"), "{e}");
    let e = Config::from_plugstack_args(&args(&["config=/nonexistent/berth.conf"])).unwrap_err();
    assert!(e.to_string().contains("cannot read"), "{e}");
    let e = Config::from_plugstack_args(&args(&["log_level=loud"])).unwrap_err();
    assert!(
        e.to_string()
            .contains("log_level=loud: expected one of error, info, verbose, debug"),
        "{e}"
    );
}

/// Every key of pyxis 0.24's plugstack line is accepted; those berth has
/// no use for leave one note each, and their values are still checked.
#[test]
fn pyxis_plugstack_keys_are_accepted_with_a_note() {
    let config = Config::from_plugstack_args(&args(&[
        "runtime_path=/run/pyxis",
        "execute_entrypoint=1",
        "container_scope=global",
        "sbatch_support=1",
        "use_enroot_load=1",
        "importer=/usr/share/pyxis/importer",
        "use_squashfuse=0",
    ]))
    .unwrap();
    assert!(config.execute_entrypoint);
    assert_eq!(config.container_scope, ContainerScope::Global);
    assert_eq!(config.notes.len(), 3, "{:?}", config.notes);
    for key in ["use_enroot_load=1", "importer=", "use_squashfuse=0"] {
        assert!(
            config
                .notes
                .iter()
                .any(|n| n.contains(key) && n.contains("pyxis key with no effect")),
            "{key}: {:?}",
            config.notes
        );
    }
    let e = Config::from_plugstack_args(&args(&["use_enroot_load=maybe"])).unwrap_err();
    assert!(e.to_string().contains("use_enroot_load=maybe"), "{e}");
    let e = Config::from_plugstack_args(&args(&["importer=importer.sh"])).unwrap_err();
    assert!(e.to_string().contains("absolute path"), "{e}");
}

/// Proxy keys replace the environment's settings for what they name;
/// a CA bundle must hold certificates.
#[test]
fn proxies_and_a_ca_bundle() {
    let config = Config::from_plugstack_args(&args(&[
        "https_proxy=http://proxy.site:3128",
        "http_proxy=http://10.0.0.1:8080",
        "no_proxy=registry.lan, .internal,10.1.2.3",
    ]))
    .unwrap();
    assert_eq!(
        config.proxy.https.as_deref(),
        Some("http://proxy.site:3128")
    );
    assert_eq!(config.proxy.http.as_deref(), Some("http://10.0.0.1:8080"));
    assert_eq!(
        config.proxy.proxy_for("https", "nvcr.io", 443),
        Some("http://proxy.site:3128")
    );
    assert_eq!(config.proxy.proxy_for("https", "registry.lan", 443), None);
    assert_eq!(config.proxy.proxy_for("http", "a.internal", 80), None);
    let none = Config::from_plugstack_args(&args(&["https_proxy="])).unwrap();
    assert_eq!(none.proxy.https, None);
    let e = Config::from_plugstack_args(&args(&["https_proxy=proxy.site:3128"])).unwrap_err();
    assert!(e.to_string().contains("http://HOST:PORT"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let e = Config::from_plugstack_args(&args(&[&format!("ca_bundle={}", empty.display())]))
        .unwrap_err();
    assert!(e.to_string().contains("holds no certificate"), "{e}");
    let e = Config::from_plugstack_args(&args(&["ca_bundle=site.pem"])).unwrap_err();
    assert!(e.to_string().contains("absolute path"), "{e}");
}

#[test]
fn mirrors_and_retries() {
    let config = Config::from_plugstack_args(&args(&[
        "mirrors=docker.io=mirror.site:5000, ghcr.io=10.0.0.1:5001",
        "registry_retries=5",
        "registry_timeout=7",
    ]))
    .unwrap();
    assert_eq!(
        config.mirrors,
        vec![
            ("docker.io".to_string(), "mirror.site:5000".to_string()),
            ("ghcr.io".to_string(), "10.0.0.1:5001".to_string())
        ]
    );
    assert_eq!(config.registry_retries, Some(5));
    assert_eq!(config.registry_timeout, Some(7));
    let config =
        Config::from_plugstack_args(&args(&["pull_user=puller", "max_image_size=512G"])).unwrap();
    assert_eq!(config.pull_user, "puller");
    assert_eq!(config.max_image_size, 512 << 30);
    assert_eq!(Config::default().pull_user, "berth");
    assert_eq!(
        Config::default().max_image_size,
        crate::image::DEFAULT_MAX_IMAGE_BYTES
    );
    assert_eq!(Config::default().squashfs_level, 3);
    let config = Config::from_plugstack_args(&args(&["squashfs_level=1"])).unwrap();
    assert_eq!(config.squashfs_level, 1);
    for bad in [
        "squashfs_level=0",
        "squashfs_level=20",
        "squashfs_level=fast",
        "pull_user=",
        "pull_user=a b",
        "max_image_size=big",
        "max_image_size=0",
    ] {
        let e = Config::from_plugstack_args(&args(&[bad])).unwrap_err();
        assert!(e.to_string().contains(bad), "{e}");
    }
    for bad in [
        "mirrors=docker.io",
        "mirrors=docker.io=https://m",
        "registry_retries=x",
        "registry_timeout=0",
        "registry_timeout=5s",
        "cancel_check=5s",
        "cancel_check=3601",
    ] {
        let e = Config::from_plugstack_args(&args(&[bad])).unwrap_err();
        assert!(
            e.to_string().contains(bad.split('=').next().unwrap()),
            "{e}"
        );
    }
    let e = Config::from_plugstack_args(&args(&["mirrors=a=/m"])).unwrap_err();
    assert!(e.to_string().contains("REGISTRY=MIRROR"), "{e}");
}

#[test]
fn cancel_check_key() {
    assert_eq!(Config::default().cancel_check, DEFAULT_CANCEL_CHECK);
    let off = Config::from_plugstack_args(&args(&["cancel_check=0"])).unwrap();
    assert_eq!(off.cancel_check, Duration::ZERO);
    let slow = Config::from_plugstack_args(&args(&["cancel_check=30"])).unwrap();
    assert_eq!(slow.cancel_check, Duration::from_secs(30));
}

#[test]
fn shared_store_keys() {
    let config = Config::from_plugstack_args(&args(&[
        "store_path=/shared/berth",
        "store_shared=1",
        "store_lease_timeout=10",
        "store_wait_timeout=600",
    ]))
    .unwrap();
    let settings = config.shared_settings().unwrap();
    assert_eq!(settings.lease_timeout, Duration::from_secs(10));
    assert_eq!(settings.wait_timeout, Duration::from_secs(600));
    assert_eq!(
        config.node_state_path("node3"),
        PathBuf::from("/shared/berth/nodes/node3")
    );
    let local = Config::from_plugstack_args(&args(&["store_path=/nvme/%n/berth"])).unwrap();
    assert!(local.shared_settings().is_none());
    assert_eq!(
        local.node_state_path("node3"),
        PathBuf::from("/nvme/node3/berth")
    );
    let e =
        Config::from_plugstack_args(&args(&["store_path=/s/%n", "store_shared=yes"])).unwrap_err();
    assert!(e.to_string().contains("remove %n from store_path"), "{e}");
    for bad in [
        "store_lease_timeout=0",
        "store_wait_timeout=x",
        "store_shared=maybe",
    ] {
        let e = Config::from_plugstack_args(&args(&[bad])).unwrap_err();
        assert!(e.to_string().contains(bad), "{e}");
    }
}

#[test]
fn every_key_has_one_entry_an_arm_and_a_line_in_the_docs() {
    // The injection keys are documented with injection.
    let docs = [
        include_str!("../../docs/CONFIGURATION.md"),
        include_str!("../../docs/INJECTION.md"),
    ]
    .concat();
    let mut seen = std::collections::BTreeSet::new();
    for Key {
        name: key, kind, ..
    } in KEYS
    {
        let expected = kind.expected();
        assert!(seen.insert(key), "{key} twice in KEYS");
        assert!(
            docs.contains(&format!("`{key}`")),
            "{key} is not in CONFIGURATION.md"
        );
        // A value no key accepts: the error says what the table says.
        let mut config = Config::default();
        if let Err(e) = config.set(key, "\u{1}bad", "test") {
            assert!(e.message.contains(&expected), "{key}: {e}");
        }
    }
    assert!(KEYS.iter().any(|k| k.name == "log_level"
        && k.kind.expected() == format!("one of {}", LogLevel::NAMES.join(", "))));
    let e = Config::default().set("nope", "1", "o").unwrap_err();
    assert!(e.message.contains(&key_names()), "{e}");
}

/// Every row of the table parses a value of its kind (its sample), the
/// error for an unknown key lists every row, and each row's default is what
/// the docs' table of keys says.
#[test]
fn every_row_of_the_key_table_parses_and_is_listed() {
    let docs = [
        include_str!("../../docs/CONFIGURATION.md"),
        include_str!("../../docs/INJECTION.md"),
    ]
    .concat();
    let unknown = Config::default().set("nope", "1", "o").unwrap_err();
    for row in KEYS {
        let sample = row.kind.sample();
        let mut config = Config::default();
        config
            .set(row.name, &sample, "test")
            .unwrap_or_else(|e| panic!("{}={sample}: {e}", row.name));
        // (A sample that is the default, `sbatch_support=1`, changes nothing.)
        if row.name != "config" && row.no_effect.is_none() && row.default != sample {
            assert_ne!(
                config,
                Config::default(),
                "{}={sample} set nothing",
                row.name
            );
        }
        assert_eq!(
            config.notes.len(),
            usize::from(row.no_effect.is_some()),
            "{}: {:?}",
            row.name,
            config.notes
        );
        assert!(
            unknown.message.contains(&format!(" {},", row.name))
                || unknown.message.contains(&format!(" {})", row.name))
                || unknown.message.contains(&format!("({},", row.name)),
            "`{}` missing from: {unknown}",
            row.name
        );
        assert!(!row.doc.is_empty(), "{}: no doc line", row.name);
        let line = docs
            .lines()
            .find(|l| {
                l.starts_with("| `")
                    && l.split('|')
                        .nth(1)
                        .unwrap()
                        .contains(&format!("`{}`", row.name))
            })
            .unwrap_or_else(|| panic!("{}: no row in the docs' key table", row.name));
        let default = line.split('|').nth(2).unwrap();
        assert!(
            default.contains(row.default),
            "{}: the table's default `{}` is not in the docs' `{default}`",
            row.name,
            row.default
        );
    }
}

#[test]
fn booleans() {
    for t in ["1", "true", "YES", "y"] {
        assert_eq!(parse_bool(t), Some(true));
    }
    for f in ["0", "false", "No", "n"] {
        assert_eq!(parse_bool(f), Some(false));
    }
    assert_eq!(parse_bool("maybe"), None);
}

#[test]
fn fanout_keys() {
    let config = Config::from_plugstack_args(&[]).unwrap();
    assert_eq!(config.fanout.mode, FanoutMode::None);
    assert!(!config.fanout.applies_to(100));
    let config = Config::from_plugstack_args(&args(&[
        "fanout=sbcast",
        "fanout_min_nodes=3",
        "fanout_wait=20",
        "fanout_intent_wait=3",
    ]))
    .unwrap();
    assert_eq!(config.fanout.intent_wait, Duration::from_secs(3));
    assert!(config.fanout.applies_to(3) && !config.fanout.applies_to(2));
    assert_eq!(config.fanout.wait, Duration::from_secs(20));
    let e = Config::from_plugstack_args(&args(&["fanout=sbcast", "store_path=/s/%n"])).unwrap_err();
    assert!(e.to_string().contains("needs fanout_dir"), "{e}");
    let config = Config::from_plugstack_args(&args(&[
        "fanout=sbcast",
        "store_path=/s/%n",
        "fanout_dir=/tmp/f",
    ]))
    .unwrap();
    assert_eq!(config.fanout_dir("n1"), PathBuf::from("/tmp/f"));
    for bad in [
        "fanout=tree",
        "fanout_min_nodes=1",
        "fanout_wait=0",
        "fanout_wait=x",
    ] {
        let e = Config::from_plugstack_args(&args(&[bad])).unwrap_err();
        assert!(e.to_string().contains(bad), "{e}");
    }
}

/// Root (slurmd, slurmstepd) never takes settings from a file someone else
/// can change: `helper_path` there names a program root runs.
#[test]
fn root_refuses_a_config_file_another_user_can_change() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("berth.conf");
    std::fs::write(&file, "helper_path=/home/mallory/berth\n").unwrap();
    let path = format!("config={}", file.display());
    let config = Config::from_plugstack_args(&args(&[&path])).unwrap();
    assert_eq!(
        config.helper_path,
        std::path::Path::new("/home/mallory/berth")
    );
    std::os::unix::fs::chown(&file, Some(65534), None).unwrap();
    let e = Config::from_plugstack_args(&args(&[&path]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&file.display().to_string())
            && e.contains("it is not root's")
            && e.contains("chown root:root"),
        "{e}"
    );
}

/// A pyxis + enroot site's proxies and CA bundle in enroot.conf serve
/// berth's pulls where berth's own settings leave them unset; a specific
/// proxy wins over all_proxy, berth's keys over enroot's.
#[test]
fn enroots_proxies_and_ca_bundle_fill_what_berth_leaves_unset() {
    let proxy_vars = ["http_proxy", "https_proxy", "all_proxy", "no_proxy"];
    if !nix::unistd::geteuid().is_root()
        || proxy_vars
            .iter()
            .any(|v| std::env::var_os(v).is_some() || std::env::var_os(v.to_uppercase()).is_some())
    {
        return;
    }
    let bundle = "/etc/ssl/certs/ca-certificates.crt";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("enroot.conf"),
        format!(
            "all_proxy proxy.site:3128\nhttps_proxy http://tls-proxy.site:8443\n\
             no_proxy localhost,.cluster\nSSL_CERT_FILE {bundle}\n"
        ),
    )
    .unwrap();
    let site = format!("enroot_config_path={}", dir.path().display());
    let config = Config::from_plugstack_args(&args(&[&site])).unwrap();
    assert_eq!(config.proxy.http.as_deref(), Some("http://proxy.site:3128"));
    assert_eq!(
        config.proxy.https.as_deref(),
        Some("http://tls-proxy.site:8443")
    );
    assert_eq!(config.proxy.no_proxy, ["localhost", ".cluster"]);
    if std::path::Path::new(bundle).exists() {
        assert_eq!(
            config.ca_bundle.as_deref(),
            Some(std::path::Path::new(bundle))
        );
    }
    let line = Config::from_plugstack_args(&args(&[&site, "https_proxy=http://berths:1"])).unwrap();
    assert_eq!(line.proxy.https.as_deref(), Some("http://berths:1"));
    assert_eq!(line.proxy.http.as_deref(), Some("http://proxy.site:3128"));
    // A value berth cannot take is left out with a note.
    std::fs::write(
        dir.path().join("enroot.conf"),
        "http_proxy socks5://proxy.site:1080\n",
    )
    .unwrap();
    let config = Config::from_plugstack_args(&args(&[&site])).unwrap();
    assert_eq!(config.proxy.http, None);
    assert!(
        config
            .notes
            .iter()
            .any(|n| n.contains("http_proxy of enroot's configuration")),
        "{:?}",
        config.notes
    );
}
