//! Hostile registry replies: every one ends in a clear error, never a hang,
//! a crash, a read of a local file or unbounded memory.

use std::sync::Arc;

use super::fake::{FakeAuth, FakeRegistry};
use super::*;
use crate::reference::ImageRef;

fn client(reg: &FakeRegistry) -> RegistryClient {
    RegistryClient::new(&RegistryOptions {
        insecure_registries: vec![reg.addr.clone()],
        credentials: Arc::new(NoCredentials),
        retry: RetryPolicy {
            initial_delay: std::time::Duration::from_millis(5),
            ..RetryPolicy::default()
        },
        proxy: ProxySettings::default(),
        ..RegistryOptions::default()
    })
}

fn image(reg: &FakeRegistry, name: &str) -> ImageRef {
    ImageRef::parse(&format!("{}/{name}", reg.addr)).unwrap()
}

/// A client that speaks TLS to every registry and tries each request once.
fn one_try_client() -> RegistryClient {
    RegistryClient::new(&RegistryOptions {
        credentials: Arc::new(NoCredentials),
        retry: RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        },
        proxy: ProxySettings::default(),
        ..RegistryOptions::default()
    })
}

fn error_of<T: std::fmt::Debug>(result: anyhow::Result<T>) -> String {
    format!("{:#}", result.unwrap_err())
}

#[test]
fn oversized_manifest_is_refused_without_reading_it_all() {
    let reg = FakeRegistry::start(FakeAuth::None);
    let mut body = b"{\"schemaVersion\":2,\"x\":\"".to_vec();
    body.resize(9 << 20, b'a');
    body.extend_from_slice(b"\"}");
    reg.put_manifest("ns/big", Some("v1"), manifest::OCI_MANIFEST, body);
    let e = error_of(client(&reg).resolve(&image(&reg, "ns/big:v1"), &Platform::current()));
    assert!(e.contains("ns/big"), "{e}");
    assert!(e.contains("bytes") || e.contains("large"), "{e}");
}

#[test]
fn malformed_and_mistyped_manifests_name_the_image() {
    let reg = FakeRegistry::start(FakeAuth::None);
    reg.put_manifest(
        "ns/broken",
        Some("json"),
        manifest::OCI_MANIFEST,
        b"{\"schemaVersion\": 2, \"layers\": [".to_vec(),
    );
    reg.put_manifest(
        "ns/broken",
        Some("html"),
        "text/html",
        b"<html>login page</html>".to_vec(),
    );
    reg.put_manifest(
        "ns/broken",
        Some("deep"),
        manifest::OCI_MANIFEST,
        format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
    );
    for tag in ["json", "html", "deep"] {
        let e = error_of(client(&reg).resolve(
            &image(&reg, &format!("ns/broken:{tag}")),
            &Platform::current(),
        ));
        assert!(e.contains("ns/broken"), "{tag}: {e}");
    }
}

#[test]
fn redirects_to_local_files_and_loops_are_refused() {
    let reg = FakeRegistry::start(FakeAuth::None);
    reg.push_image("ns/app", "v1", vec![b"layer".to_vec()], &[]);
    let c = client(&reg);
    let resolved = c
        .resolve(&image(&reg, "ns/app:v1"), &Platform::current())
        .unwrap();
    let layer = &resolved.manifest.layers[0];
    let digest = Digest::parse(&layer.digest).unwrap();

    reg.fail_next(
        "307 Temporary Redirect",
        &[("Location", "file:///etc/passwd")],
    );
    let mut out = Vec::new();
    let e = error_of(c.fetch_blob(&image(&reg, "ns/app:v1"), &digest, None, &mut out));
    assert!(!out.windows(5).any(|w| w == b"root:"), "read a local file");
    assert!(e.contains("not an http"), "{e}");

    let blob_url = format!("http://{}/v2/ns/app/blobs/{digest}", reg.addr);
    for _ in 0..12 {
        reg.fail_next("307 Temporary Redirect", &[("Location", &blob_url)]);
    }
    let mut out = Vec::new();
    let e = error_of(c.fetch_blob(&image(&reg, "ns/app:v1"), &digest, None, &mut out));
    assert!(e.contains("redirect"), "{e}");
}

#[test]
fn a_token_that_keeps_being_refused_ends_in_a_clear_denial() {
    let reg = FakeRegistry::start(FakeAuth::None);
    reg.push_image("ns/app", "v1", vec![b"layer".to_vec()], &[]);
    let challenge = format!(
        "Bearer realm=\"http://{}/token\",service=\"fake\",scope=\"repository:other/repo:pull\"",
        reg.addr
    );
    for _ in 0..12 {
        reg.fail_next("401 Unauthorized", &[("WWW-Authenticate", &challenge)]);
    }
    let started = std::time::Instant::now();
    let e = error_of(client(&reg).resolve(&image(&reg, "ns/app:v1"), &Platform::current()));
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert!(e.contains("ns/app"), "{e}");
    assert!(
        e.contains("denied") || e.contains("credentials") || e.contains("401"),
        "{e}"
    );
}

#[test]
fn a_registry_without_tls_gets_a_clear_tls_error() {
    let reg = FakeRegistry::start(FakeAuth::None);
    reg.push_image("ns/app", "v1", vec![b"layer".to_vec()], &[]);
    // Not listed as insecure: the client speaks TLS to a plain-HTTP server.
    let c = one_try_client();
    let e = error_of(c.resolve(&image(&reg, "ns/app:v1"), &Platform::current()));
    assert!(
        e.contains(&reg.addr) && e.contains("insecure_registries"),
        "{e}"
    );
}

/// A real TLS server (`openssl s_server`) with a self-signed certificate
/// that the system does not trust: the error names the registry and says to
/// install its CA.
#[test]
fn a_registry_with_an_untrusted_certificate_gets_a_clear_tls_error() {
    use std::process::{Command, Stdio};
    let Ok(version) = Command::new("openssl").arg("version").output() else {
        crate::test_support::skip_because(
            "a_registry_with_an_untrusted_certificate_gets_a_clear_tls_error",
            "no openssl command (apt-get install openssl)",
        );
        return;
    };
    assert!(version.status.success());
    let dir = tempfile::tempdir().unwrap();
    // A site CA, and the server's certificate signed by it.
    let path = |name: &str| dir.path().join(name);
    let (ca, ca_key) = (path("ca.pem"), path("ca-key.pem"));
    let (cert, key, request) = (path("cert.pem"), path("key.pem"), path("cert.csr"));
    std::fs::write(path("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    let openssl = |args: &[&std::ffi::OsStr]| {
        let made = Command::new("openssl")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(made.success(), "openssl {args:?} failed");
    };
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    openssl(&[
        os("req"),
        os("-x509"),
        os("-newkey"),
        os("rsa:2048"),
        os("-nodes"),
        os("-days"),
        os("1"),
        os("-subj"),
        os("/CN=berth test site CA"),
        os("-keyout"),
        ca_key.as_os_str(),
        os("-out"),
        ca.as_os_str(),
    ]);
    openssl(&[
        os("req"),
        os("-newkey"),
        os("rsa:2048"),
        os("-nodes"),
        os("-subj"),
        os("/CN=127.0.0.1"),
        os("-keyout"),
        key.as_os_str(),
        os("-out"),
        request.as_os_str(),
    ]);
    let ext = path("ext.cnf");
    openssl(&[
        os("x509"),
        os("-req"),
        os("-in"),
        request.as_os_str(),
        os("-CA"),
        ca.as_os_str(),
        os("-CAkey"),
        ca_key.as_os_str(),
        os("-CAcreateserial"),
        os("-days"),
        os("1"),
        os("-extfile"),
        ext.as_os_str(),
        os("-out"),
        cert.as_os_str(),
    ]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = Command::new("openssl")
        .args(["s_server", "-quiet", "-www", "-accept"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-cert")
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let up = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        std::net::TcpStream::connect(&addr).is_ok()
    });
    let reference = ImageRef::parse(&format!("{addr}/ns/app:v1")).unwrap();
    let c = one_try_client();
    let result = c.resolve(&reference, &Platform::current());
    // With the certificate in a site CA bundle (`ca_bundle`), the handshake
    // passes: what fails then is that the server is no registry.
    let trusted = RegistryClient::new(&RegistryOptions {
        retry: RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        },
        ca_bundle: Some(ca.clone()),
        ..RegistryOptions::default()
    })
    .resolve(&reference, &Platform::current());
    let _ = server.kill();
    let _ = server.wait();
    assert!(up, "openssl s_server did not start");
    let e = error_of(result);
    assert!(
        e.contains(&addr) && e.contains("install its CA") && e.contains("ca_bundle"),
        "{e}"
    );
    let e = error_of(trusted);
    assert!(
        !e.contains("certificate") && !e.contains("TLS"),
        "the CA bundle was not trusted: {e}"
    );
}
