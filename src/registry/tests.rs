//! Client tests against the in-process fake registry.

use std::path::Path;
use std::sync::Arc;

use super::fake::{FakeAuth, FakeRegistry};
use super::*;
use crate::reference::ImageRef;

fn options(reg: &FakeRegistry) -> RegistryOptions {
    RegistryOptions {
        insecure_registries: vec![
            reg.addr.clone(),
            format!("localhost:{}", reg.addr.rsplit(':').next().unwrap()),
        ],
        credentials: Arc::new(NoCredentials),
        retry: fast_retries(),
        proxy: ProxySettings::default(),
        ..RegistryOptions::default()
    }
}

/// The default number of attempts, with short waits.
fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        initial_delay: std::time::Duration::from_millis(10),
        ..RetryPolicy::default()
    }
}

fn image(reg: &FakeRegistry, name: &str) -> ImageRef {
    ImageRef::parse(&format!("{}/{name}", reg.addr)).unwrap()
}

fn err_of<T: std::fmt::Debug>(r: anyhow::Result<T>) -> RegistryError {
    let e = r.unwrap_err();
    e.downcast_ref::<RegistryError>()
        .unwrap_or_else(|| panic!("not a RegistryError: {e:#}"))
        .clone()
}

#[test]
fn resolves_and_verifies_blobs() {
    let reg = FakeRegistry::start(FakeAuth::None);
    let digest = reg.push_image("ns/app", "v1", vec![b"layer".to_vec()], &["A=1"]);
    let client = RegistryClient::new(&options(&reg));
    let r = client
        .resolve(&image(&reg, "ns/app:v1"), &Platform::current())
        .unwrap();
    assert_eq!(r.manifest_digest, digest);
    assert_eq!(r.image.digest.as_deref(), Some(digest.as_str()));
    assert_eq!(r.manifest.layers.len(), 1);

    // By digest too.
    let by_digest = image(&reg, &format!("ns/app@{digest}"));
    assert_eq!(
        client
            .resolve(&by_digest, &Platform::current())
            .unwrap()
            .manifest_digest,
        digest
    );

    let layer = Digest::parse(&r.manifest.layers[0].digest).unwrap();
    let mut out = Vec::new();
    client
        .fetch_blob(&r.image, &layer, Some(5), &mut out)
        .unwrap();
    assert_eq!(out, b"layer");

    reg.corrupt_blob(&layer, b"LAYER".to_vec());
    let e = err_of(client.fetch_blob(&r.image, &layer, Some(5), &mut Vec::new()));
    assert!(matches!(e, RegistryError::DigestMismatch { .. }), "{e}");
    assert!(
        e.to_string().contains(layer.as_str()) && e.to_string().contains(&reg.addr),
        "{e}"
    );
}

#[test]
fn errors_by_kind() {
    let reg = FakeRegistry::start(FakeAuth::None);
    let client = RegistryClient::new(&options(&reg));
    let e = err_of(client.resolve(&image(&reg, "ns/nope:v1"), &Platform::current()));
    assert!(matches!(e, RegistryError::ManifestUnknown { .. }), "{e}");
    assert!(
        e.to_string().contains("not found in registry")
            && e.to_string().contains("check the name and tag")
    );

    // A closed port on loopback: unreachable.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = ImageRef::parse(&format!("127.0.0.1:{port}/x:y")).unwrap();
    let client = RegistryClient::new(&RegistryOptions {
        insecure_registries: vec![format!("127.0.0.1:{port}")],
        ..options(&reg)
    });
    let e = err_of(client.resolve(&dead, &Platform::current()));
    assert!(matches!(e, RegistryError::Unreachable { .. }), "{e}");
    assert!(
        e.to_string()
            .contains(&format!("127.0.0.1:{port} cannot be reached")),
        "{e}"
    );
}

#[test]
fn manifest_digest_checks() {
    let reg = FakeRegistry::start(FakeAuth::None);
    let digest = reg.push_image("ns/app", "v1", vec![b"l".to_vec()], &[]);
    let client = RegistryClient::new(&options(&reg));
    // Pull by a digest whose content differs.
    let other = Digest::of_bytes(b"other");
    reg.put_manifest("ns/app", None, manifest::OCI_MANIFEST, b"{}".to_vec());
    let wrong = image(&reg, &format!("ns/app@{other}"));
    assert!(client.fetch_manifest(&wrong, other.as_str()).is_err());
    // Docker-Content-Digest disagreeing with the bytes.
    reg.state.lock().unwrap().wrong_content_digest = true;
    let e = err_of(client.fetch_manifest(&image(&reg, "ns/app:v1"), "v1"));
    assert!(matches!(e, RegistryError::DigestMismatch { .. }), "{e}");
    let _ = digest;
}

#[test]
fn indexes_choose_the_platform() {
    let reg = FakeRegistry::start(FakeAuth::None);
    let here = reg.push_image("ns/multi", "native", vec![b"native".to_vec()], &[]);
    let other = reg.push_image("ns/multi", "other", vec![b"other".to_vec()], &[]);
    let current = Platform::current();
    let platform = |p: &Platform| serde_json::to_value(p).unwrap();
    let foreign = Platform {
        os: "linux".into(),
        architecture: "s390x".into(),
        variant: None,
    };
    let inner = reg.push_index(
        "ns/multi",
        "inner",
        &[(platform(&foreign), &other), (platform(&current), &here)],
    );
    // Nested: an index whose entry for this platform is itself an index.
    let outer = reg.push_index("ns/multi", "latest", &[(platform(&current), &inner)]);
    let client = RegistryClient::new(&options(&reg));
    let r = client
        .resolve(&image(&reg, "ns/multi:latest"), &current)
        .unwrap();
    assert_eq!(r.manifest_digest, here);
    assert_eq!(r.index_digest, Some(outer));

    reg.push_index("ns/multi", "foreign", &[(platform(&foreign), &other)]);
    let e = err_of(client.resolve(&image(&reg, "ns/multi:foreign"), &current));
    assert!(matches!(e, RegistryError::NoMatchingPlatform { .. }), "{e}");
    assert!(e.to_string().contains("linux/s390x"), "{e}");
}

#[test]
fn bearer_tokens_are_fetched_once_and_not_sent_elsewhere() {
    let reg = FakeRegistry::start(FakeAuth::Bearer { login: None });
    reg.push_image("ns/app", "v1", vec![b"a".to_vec(), b"b".to_vec()], &[]);
    reg.state.lock().unwrap().redirect_blobs = true;
    let client = RegistryClient::new(&options(&reg));
    let r = client
        .resolve(&image(&reg, "ns/app:v1"), &Platform::current())
        .unwrap();
    for l in &r.manifest.layers {
        let mut out = Vec::new();
        client
            .fetch_blob(
                &r.image,
                &Digest::parse(&l.digest).unwrap(),
                Some(l.size),
                &mut out,
            )
            .unwrap();
    }
    assert_eq!(
        reg.count("GET /token"),
        1,
        "token reused: {:?}",
        reg.state.lock().unwrap().log
    );
    assert_eq!(reg.count("GET /cdn/"), 2);
    assert_eq!(
        reg.count("GET /cdn/ noauth") + reg.count("GET /cdn/sha256"),
        2
    );
    assert!(!reg
        .state
        .lock()
        .unwrap()
        .log
        .iter()
        .any(|l| l.starts_with("GET /cdn/") && l.ends_with(" auth")));
}

/// Bearer tokens kept in a token file serve the next client (the user's
/// next srun) until they expire; one the registry refuses is replaced.
#[test]
fn kept_tokens_serve_the_next_process_and_a_refused_one_is_replaced() {
    use super::token_file::{now_secs, KeptToken, TokenFile};
    let reg = FakeRegistry::start(FakeAuth::Bearer { login: None });
    reg.push_image("ns/app", "v1", vec![b"a".to_vec()], &[]);
    let dir = tempfile::tempdir().unwrap();
    let file = TokenFile::in_dir(&dir.path().join("berth"));
    let kept = || RegistryOptions {
        token_file: Some(file.clone()),
        ..options(&reg)
    };
    let app = image(&reg, "ns/app:v1");
    for _ in 0..3 {
        RegistryClient::new(&kept()).top_digest(&app).unwrap();
    }
    assert_eq!(reg.count("GET /token"), 1, "one token for three clients");
    RegistryClient::new(&options(&reg))
        .top_digest(&app)
        .unwrap();
    assert_eq!(reg.count("GET /token"), 2, "no token file, no reuse");

    let mut tokens = file.load();
    assert_eq!(tokens.len(), 1);
    for token in tokens.values_mut() {
        *token = KeptToken {
            header: "Bearer revoked".to_string(),
            expires: now_secs() + 300,
        };
    }
    file.save(&tokens);
    RegistryClient::new(&kept()).top_digest(&app).unwrap();
    assert_eq!(reg.count("GET /token"), 3, "a refused token is replaced");
    let replaced = file.load();
    assert!(
        replaced.values().all(|t| t.header != "Bearer revoked"),
        "{replaced:?}"
    );
    RegistryClient::new(&kept()).top_digest(&app).unwrap();
    assert_eq!(reg.count("GET /token"), 3);
}

#[test]
fn credentials_for_token_and_basic_auth() {
    let creds_path = Path::new("/home/u/.config/enroot/.credentials");
    // Bearer whose token service needs a login, found by the registry host.
    let reg = FakeRegistry::start(FakeAuth::Bearer {
        login: Some(("alice".into(), "s3cret".into())),
    });
    reg.push_image("ns/private", "v1", vec![b"a".to_vec()], &[]);
    let anonymous = RegistryClient::new(&options(&reg));
    let e = err_of(anonymous.resolve(&image(&reg, "ns/private:v1"), &Platform::current()));
    assert!(matches!(e, RegistryError::Denied { .. }), "{e}");
    let text = format!("machine {} login alice password s3cret\n", reg.addr);
    let with_creds = RegistryClient::new(&RegistryOptions {
        credentials: Arc::new(EnrootCredentials::from_text(creds_path, &text)),
        ..options(&reg)
    });
    with_creds
        .resolve(&image(&reg, "ns/private:v1"), &Platform::current())
        .unwrap();

    // Basic auth: denied without the right password, with a hint naming the file.
    let reg = FakeRegistry::start(FakeAuth::Basic {
        login: "bob".into(),
        password: "pw".into(),
    });
    reg.push_image("ns/b", "v1", vec![b"a".to_vec()], &[]);
    let wrong = format!("machine {} login bob password nope\n", reg.addr);
    let client = RegistryClient::new(&RegistryOptions {
        credentials: Arc::new(EnrootCredentials::from_text(creds_path, &wrong)),
        ..options(&reg)
    });
    let e = err_of(client.resolve(&image(&reg, "ns/b:v1"), &Platform::current()));
    assert!(matches!(e, RegistryError::Denied { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("access denied") && msg.contains(".credentials") && !msg.contains("nope"),
        "{msg}"
    );
    let right = format!("machine {} login bob password pw\n", reg.addr);
    let client = RegistryClient::new(&RegistryOptions {
        credentials: Arc::new(EnrootCredentials::from_text(creds_path, &right)),
        ..options(&reg)
    });
    client
        .resolve(&image(&reg, "ns/b:v1"), &Platform::current())
        .unwrap();
}

#[test]
fn transient_failures_are_retried() {
    let reg = FakeRegistry::start(FakeAuth::None);
    let digest = reg.push_image("ns/app", "v1", vec![b"layer".to_vec()], &[]);
    let client = RegistryClient::new(&options(&reg));
    reg.fail_next("503 Service Unavailable", &[]);
    let r = client
        .resolve(&image(&reg, "ns/app:v1"), &Platform::current())
        .unwrap();
    assert_eq!(r.manifest_digest, digest);
    assert_eq!(reg.count("GET /v2/ns/app/manifests/v1"), 2);

    // 429 with Retry-After: 1 waits that second, then succeeds.
    reg.fail_next("429 Too Many Requests", &[("Retry-After", "1")]);
    let layer = Digest::parse(&r.manifest.layers[0].digest).unwrap();
    let started = std::time::Instant::now();
    let mut out = Vec::new();
    client
        .fetch_blob(&r.image, &layer, Some(5), &mut out)
        .unwrap();
    assert_eq!(out, b"layer");
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_secs(1) && waited < std::time::Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(reg.count(&format!("GET /v2/ns/app/blobs/{layer}")), 2);

    // Bounded: after `attempts` failures the last error is reported.
    for _ in 0..4 {
        reg.fail_next("502 Bad Gateway", &[]);
    }
    let e = err_of(client.fetch_manifest(&image(&reg, "ns/app:v1"), "v1"));
    assert!(matches!(e, RegistryError::Http { status: 502, .. }), "{e}");
    assert_eq!(reg.count("GET /v2/ns/app/manifests/v1"), 6);

    // A Retry-After beyond the time bound is not waited for.
    reg.state.lock().unwrap().failures.clear();
    reg.fail_next("429 Too Many Requests", &[("Retry-After", "3600")]);
    let e = err_of(client.fetch_manifest(&image(&reg, "ns/app:v1"), "v1"));
    assert!(matches!(e, RegistryError::Http { status: 429, .. }), "{e}");

    // Not found is final: asked once.
    let before = reg.count("GET /v2/ns/none/");
    let e = err_of(client.resolve(&image(&reg, "ns/none:v1"), &Platform::current()));
    assert!(matches!(e, RegistryError::ManifestUnknown { .. }), "{e}");
    assert_eq!(reg.count("GET /v2/ns/none/"), before + 1);
}

#[test]
fn mirrors_are_tried_first() {
    let origin = FakeRegistry::start(FakeAuth::None);
    let mirror = FakeRegistry::start(FakeAuth::None);
    let layers = || vec![b"base".to_vec(), b"top".to_vec()];
    let digest = origin.push_image("ns/app", "v1", layers(), &[]);
    assert_eq!(mirror.push_image("ns/app", "v1", layers(), &[]), digest);
    let client = RegistryClient::new(&RegistryOptions {
        insecure_registries: vec![origin.addr.clone(), mirror.addr.clone()],
        mirrors: vec![(origin.addr.clone(), mirror.addr.clone())],
        ..options(&origin)
    });
    let wanted = image(&origin, "ns/app:v1");
    let fetch_all = |r: &ResolvedImage| {
        for layer in &r.manifest.layers {
            let d = Digest::parse(&layer.digest).unwrap();
            client
                .fetch_blob(&wanted, &d, Some(layer.size), &mut Vec::new())
                .unwrap();
        }
    };

    // The mirror has everything: the origin is not asked.
    let r = client.resolve(&wanted, &Platform::current()).unwrap();
    assert_eq!(r.manifest_digest, digest);
    assert_eq!(r.image.registry, origin.addr, "the result names the origin");
    fetch_all(&r);
    assert_eq!(mirror.count("GET /v2/ns/app/blobs/"), 2);
    assert!(origin.state.lock().unwrap().log.is_empty());

    // The mirror lacks a layer: that blob comes from the origin.
    let top = Digest::of_bytes(b"top");
    mirror.fail_next("404 Not Found", &[]);
    client
        .fetch_blob(&wanted, &top, Some(3), &mut Vec::new())
        .unwrap();
    assert_eq!(origin.count(&format!("GET /v2/ns/app/blobs/{top}")), 1);

    // The mirror is down (or lacks the image): everything comes from the origin.
    let other = origin.push_image(
        "ns/other",
        "v1",
        vec![b"other1".to_vec(), b"other2".to_vec()],
        &[],
    );
    let wanted = image(&origin, "ns/other:v1");
    let r = client.resolve(&wanted, &Platform::current()).unwrap();
    assert_eq!(r.manifest_digest, other);
    assert_eq!(mirror.count("GET /v2/ns/other/manifests/v1"), 1);
    assert_eq!(origin.count("GET /v2/ns/other/manifests/v1"), 1);
    for layer in &r.manifest.layers {
        let d = Digest::parse(&layer.digest).unwrap();
        client
            .fetch_blob(&wanted, &d, Some(layer.size), &mut Vec::new())
            .unwrap();
    }
    assert_eq!(origin.count("GET /v2/ns/other/blobs/"), 2);
}

#[test]
fn proxies_and_no_proxy() {
    // The fake registry also serves proxy requests, so it can play the proxy
    // for a registry host that does not exist.
    let proxy = FakeRegistry::start(FakeAuth::None);
    let digest = proxy.push_image("ns/app", "v1", vec![b"layer".to_vec()], &[]);
    let far = ImageRef::parse("registry.invalid:5000/ns/app:v1").unwrap();
    let settings = |no_proxy: &str| ProxySettings {
        http: Some(format!("http://{}", proxy.addr)),
        https: None,
        no_proxy: vec![no_proxy.to_string()],
    };
    let client = |no_proxy: &str| {
        RegistryClient::new(&RegistryOptions {
            insecure_registries: vec!["registry.invalid:5000".to_string()],
            proxy: settings(no_proxy),
            retry: RetryPolicy::never(),
            ..options(&proxy)
        })
    };
    let r = client("other.invalid")
        .resolve(&far, &Platform::current())
        .unwrap();
    assert_eq!(r.manifest_digest, digest);
    assert_eq!(proxy.state.lock().unwrap().proxied, 1);

    // NO_PROXY: the host is asked directly, and does not resolve.
    let e = err_of(client(".invalid").resolve(&far, &Platform::current()));
    assert!(matches!(e, RegistryError::Unreachable { .. }), "{e}");
    assert_eq!(proxy.state.lock().unwrap().proxied, 1);
}
