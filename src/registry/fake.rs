//! A tiny in-process registry on 127.0.0.1 for tests: manifests, blobs,
//! optional bearer or basic auth, optional blob redirects to another origin.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::auth::base64;
use super::digest::Digest;
use super::manifest::{OCI_INDEX, OCI_MANIFEST};

/// How the fake registry wants clients to authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeAuth {
    None,
    /// Bearer tokens from `/token`; when `login` is set the token service
    /// requires that basic login.
    Bearer {
        login: Option<(String, String)>,
    },
    Basic {
        login: String,
        password: String,
    },
}

#[derive(Debug, Default)]
pub struct State {
    manifests: HashMap<String, (String, Vec<u8>)>,
    blobs: HashMap<String, Vec<u8>>,
    /// Served instead of the real blob (to test corruption).
    corrupt: HashMap<String, Vec<u8>>,
    /// Requests seen: "METHOD PATH AUTH?" lines.
    pub log: Vec<String>,
    pub wrong_content_digest: bool,
    pub redirect_blobs: bool,
    /// Answers given, in order, to the next requests instead of the real ones:
    /// status line and headers (e.g. `"503 Service Unavailable"`).
    pub failures: std::collections::VecDeque<(String, Vec<(String, String)>)>,
    /// Requests that came as a proxy's (absolute URL).
    pub proxied: usize,
    /// Blob digests whose next answer sends only half the body, then closes
    /// (one answer per entry).
    pub truncate_blobs: Vec<String>,
}

pub struct FakeRegistry {
    pub addr: String,
    pub state: Arc<Mutex<State>>,
    auth: FakeAuth,
    stop: Arc<AtomicBool>,
}

const TOKEN: &str = "t0k3n";

impl FakeRegistry {
    pub fn start(auth: FakeAuth) -> FakeRegistry {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp, au, ad) = (state.clone(), stop.clone(), auth.clone(), addr.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if sp.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (st, au, ad) = (st.clone(), au.clone(), ad.clone());
                std::thread::spawn(move || handle(conn, &st, &au, &ad));
            }
        });
        FakeRegistry {
            addr,
            state,
            auth,
            stop,
        }
    }

    pub fn put_blob(&self, data: Vec<u8>) -> Digest {
        let d = Digest::of_bytes(&data);
        self.state.lock().unwrap().blobs.insert(d.to_string(), data);
        d
    }

    pub fn corrupt_blob(&self, digest: &Digest, data: Vec<u8>) {
        self.state
            .lock()
            .unwrap()
            .corrupt
            .insert(digest.to_string(), data);
    }

    pub fn put_manifest(
        &self,
        repo: &str,
        tag: Option<&str>,
        media_type: &str,
        bytes: Vec<u8>,
    ) -> Digest {
        let d = Digest::of_bytes(&bytes);
        let mut st = self.state.lock().unwrap();
        st.manifests.insert(
            format!("{repo}@{d}"),
            (media_type.to_string(), bytes.clone()),
        );
        if let Some(tag) = tag {
            st.manifests
                .insert(format!("{repo}@{tag}"), (media_type.to_string(), bytes));
        }
        d
    }

    /// Pushes an image made of `layers` (already compressed or not) and a config
    /// with `env`; returns the manifest digest.
    pub fn push_image(&self, repo: &str, tag: &str, layers: Vec<Vec<u8>>, env: &[&str]) -> Digest {
        let config = serde_json::json!({
            "architecture": crate::registry::platform::Platform::current().architecture,
            "os": "linux",
            "config": {"Env": env, "Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": []}
        });
        let config = serde_json::to_vec(&config).unwrap();
        let config_size = config.len();
        let config_digest = self.put_blob(config);
        let layers: Vec<_> = layers
            .into_iter()
            .map(|l| {
                let size = l.len();
                let d = self.put_blob(l);
                serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                   "digest": d.to_string(), "size": size})
            })
            .collect();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest.to_string(), "size": config_size},
            "layers": layers,
        });
        self.put_manifest(
            repo,
            Some(tag),
            OCI_MANIFEST,
            serde_json::to_vec(&manifest).unwrap(),
        )
    }

    /// Pushes an index pointing at `entries` (platform JSON, manifest digest).
    pub fn push_index(
        &self,
        repo: &str,
        tag: &str,
        entries: &[(serde_json::Value, &Digest)],
    ) -> Digest {
        let manifests: Vec<_> = entries
            .iter()
            .map(|(p, d)| serde_json::json!({"mediaType": OCI_MANIFEST, "digest": d.to_string(), "size": 1, "platform": p}))
            .collect();
        let index =
            serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests});
        self.put_manifest(
            repo,
            Some(tag),
            OCI_INDEX,
            serde_json::to_vec(&index).unwrap(),
        )
    }

    /// Makes the next requests fail with `status` (e.g. `"503 Service
    /// Unavailable"`) and `headers`, once each.
    pub fn fail_next(&self, status: &str, headers: &[(&str, &str)]) {
        let headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.state
            .lock()
            .unwrap()
            .failures
            .push_back((status.to_string(), headers));
    }

    /// Requests whose line starts with `prefix` (e.g. "GET /v2/x/blobs/").
    pub fn count(&self, prefix: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .log
            .iter()
            .filter(|l| l.starts_with(prefix))
            .count()
    }
}

impl Drop for FakeRegistry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
        let _ = &self.auth;
    }
}

fn respond(conn: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(body);
}

fn handle(mut conn: TcpStream, state: &Mutex<State>, auth: &FakeAuth, addr: &str) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
    );
    let mut authz = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("authorization") {
                authz = Some(v.trim().to_string());
            }
        }
    }
    // A proxy request names the whole URL: serve it as if asked directly.
    let proxied = target.starts_with("http://");
    let target = match target.strip_prefix("http://") {
        Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]).to_string(),
        None => target,
    };
    if proxied {
        state.lock().unwrap().proxied += 1;
    }
    let path = target.split('?').next().unwrap_or("").to_string();
    state.lock().unwrap().log.push(format!(
        "{method} {path} {}",
        if authz.is_some() { "auth" } else { "noauth" }
    ));
    let failure = state.lock().unwrap().failures.pop_front();
    if let Some((status, headers)) = failure {
        let headers: Vec<(&str, String)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        return respond(&mut conn, &status, &headers, b"");
    }
    let error = |code: &str| {
        serde_json::json!({"errors": [{"code": code, "message": code.to_lowercase()}]}).to_string()
    };

    if path == "/token" {
        if let FakeAuth::Bearer {
            login: Some((l, p)),
        } = auth
        {
            if authz.as_deref() != Some(&format!("Basic {}", base64(format!("{l}:{p}").as_bytes())))
            {
                return respond(
                    &mut conn,
                    "401 Unauthorized",
                    &[],
                    error("UNAUTHORIZED").as_bytes(),
                );
            }
        }
        let body = serde_json::json!({"token": TOKEN, "expires_in": 300}).to_string();
        return respond(
            &mut conn,
            "200 OK",
            &[("Content-Type", "application/json".into())],
            body.as_bytes(),
        );
    }
    if let Some(digest) = path.strip_prefix("/cdn/") {
        let st = state.lock().unwrap();
        return match st.blobs.get(digest) {
            Some(b) => respond(&mut conn, "200 OK", &[], b),
            None => respond(&mut conn, "404 Not Found", &[], b""),
        };
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return respond(&mut conn, "404 Not Found", &[], b"");
    };
    let repo_of = |marker: &str| {
        rest.split_once(marker)
            .map(|(r, x)| (r.to_string(), x.to_string()))
    };
    let repo = repo_of("/manifests/")
        .or_else(|| repo_of("/blobs/"))
        .map(|r| r.0)
        .unwrap_or_default();
    let ok = match auth {
        FakeAuth::None => true,
        FakeAuth::Bearer { .. } => authz.as_deref() == Some(&format!("Bearer {TOKEN}")),
        FakeAuth::Basic { login, password } => {
            authz.as_deref()
                == Some(&format!(
                    "Basic {}",
                    base64(format!("{login}:{password}").as_bytes())
                ))
        }
    };
    if !ok {
        let challenge = match auth {
            FakeAuth::Basic { .. } => "Basic realm=\"fake\"".to_string(),
            _ => format!("Bearer realm=\"http://{addr}/token\",service=\"fake\",scope=\"repository:{repo}:pull\""),
        };
        return respond(
            &mut conn,
            "401 Unauthorized",
            &[("WWW-Authenticate", challenge)],
            error("UNAUTHORIZED").as_bytes(),
        );
    }
    let st = state.lock().unwrap();
    if let Some((repo, reference)) = repo_of("/manifests/") {
        return match st.manifests.get(&format!("{repo}@{reference}")) {
            Some((mt, bytes)) => {
                let digest = if st.wrong_content_digest {
                    Digest::of_bytes(b"something else")
                } else {
                    Digest::of_bytes(bytes)
                };
                respond(
                    &mut conn,
                    "200 OK",
                    &[
                        ("Content-Type", mt.clone()),
                        ("Docker-Content-Digest", digest.to_string()),
                    ],
                    bytes,
                )
            }
            None => respond(
                &mut conn,
                "404 Not Found",
                &[("Content-Type", "application/json".into())],
                error("MANIFEST_UNKNOWN").as_bytes(),
            ),
        };
    }
    if let Some((_, digest)) = repo_of("/blobs/") {
        if let Some(bad) = st.corrupt.get(&digest) {
            return respond(&mut conn, "200 OK", &[], bad);
        }
        if st.redirect_blobs && st.blobs.contains_key(&digest) {
            // "localhost" is another origin than "127.0.0.1" for the client.
            let port = addr.rsplit(':').next().unwrap();
            return respond(
                &mut conn,
                "307 Temporary Redirect",
                &[(
                    "Location",
                    format!("http://localhost:{port}/cdn/{digest}?sig=secret"),
                )],
                b"",
            );
        }
        drop(st);
        let mut st = state.lock().unwrap();
        if let Some(i) = st.truncate_blobs.iter().position(|d| *d == digest) {
            st.truncate_blobs.remove(i);
            let b = st.blobs[&digest].clone();
            drop(st);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                b.len()
            );
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(&b[..b.len() / 2]);
            return;
        }
        return match st.blobs.get(&digest) {
            Some(b) => respond(&mut conn, "200 OK", &[], b),
            None => respond(
                &mut conn,
                "404 Not Found",
                &[],
                error("BLOB_UNKNOWN").as_bytes(),
            ),
        };
    }
    respond(&mut conn, "404 Not Found", &[], b"")
}
