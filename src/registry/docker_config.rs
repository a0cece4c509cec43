//! Credentials from docker's `config.json`: `auths` entries (base64 `auth`
//! or `username`/`password`) and credential helpers (`credHelpers` per
//! registry, `credsStore` for all), which are run as
//! `docker-credential-NAME get` with the registry on stdin and answer JSON.
//!
//! Helpers are programs named by the user's file, so they are never run by
//! root (the Slurm plugin pulls as root): as root only `auths` is read.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::auth::base64_decode;
use super::credentials::{Credential, Credentials};

/// How long a credential helper may take to answer.
const HELPER_TIMEOUT: Duration = Duration::from_secs(30);

/// Docker Hub's key in `config.json` and for credential helpers.
const DOCKER_HUB_SERVER: &str = "https://index.docker.io/v1/";

/// The parts of `config.json` berth reads (no `Debug`: it holds secrets).
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfigFile {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(default)]
    cred_helpers: BTreeMap<String, String>,
    #[serde(default)]
    creds_store: Option<String>,
}

#[derive(Default, Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// A credential helper's answer to `get`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct HelperAnswer {
    username: String,
    secret: String,
}

/// docker's `config.json`, read once when constructed; helpers run on demand
/// (once per registry).
pub struct DockerCredentials {
    path: PathBuf,
    auths: BTreeMap<String, Credential>,
    cred_helpers: BTreeMap<String, String>,
    creds_store: Option<String>,
    run_helpers: bool,
    helper_path: Option<OsString>,
    helper_answers: Mutex<HashMap<(String, String), Option<Credential>>>,
}

impl fmt::Debug for DockerCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DockerCredentials")
            .field("path", &self.path)
            .field("auths", &self.auths.keys().collect::<Vec<_>>())
            .field("cred_helpers", &self.cred_helpers)
            .field("creds_store", &self.creds_store)
            .field("run_helpers", &self.run_helpers)
            .finish()
    }
}

impl DockerCredentials {
    /// `$DOCKER_CONFIG/config.json`, else `$HOME/.docker/config.json`.
    pub fn default_path() -> Option<PathBuf> {
        match (std::env::var_os("DOCKER_CONFIG"), std::env::var_os("HOME")) {
            (Some(dir), _) if !dir.is_empty() => Some(PathBuf::from(dir).join("config.json")),
            (_, Some(home)) if !home.is_empty() => {
                Some(PathBuf::from(home).join(".docker/config.json"))
            }
            _ => None,
        }
    }

    /// Reads the file at the default path; a missing file means no credentials.
    pub fn from_env() -> DockerCredentials {
        let path =
            Self::default_path().unwrap_or_else(|| PathBuf::from("$HOME/.docker/config.json"));
        Self::load(&path)
    }

    /// Reads `path`; a missing file means no credentials, an unreadable or
    /// malformed one too, with a warning.
    pub fn load(path: &Path) -> DockerCredentials {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::from_text(path, &text),
            Err(e) => {
                if e.kind() != std::io::ErrorKind::NotFound {
                    eprintln!(
                        "berth: warning: cannot read docker config {}: {e}; not using it",
                        path.display()
                    );
                }
                Self::from_text(path, "{}")
            }
        }
    }

    /// Parses `config.json` text (as if read from `path`).
    pub fn from_text(path: &Path, text: &str) -> DockerCredentials {
        let file: ConfigFile = serde_json::from_str(text).unwrap_or_else(|e| {
            eprintln!(
                "berth: warning: docker config {} is not valid JSON ({e}); not using it",
                path.display()
            );
            ConfigFile::default()
        });
        let auths = file
            .auths
            .into_iter()
            .filter_map(|(key, entry)| Some((normalize(&key), entry.credential()?)))
            .collect();
        DockerCredentials {
            path: path.to_path_buf(),
            auths,
            cred_helpers: file
                .cred_helpers
                .into_iter()
                .map(|(k, v)| (normalize(&k), v))
                .collect(),
            creds_store: file.creds_store.filter(|s| !s.is_empty()),
            run_helpers: !nix::unistd::geteuid().is_root(),
            helper_path: None,
            helper_answers: Mutex::new(HashMap::new()),
        }
    }

    /// Whether credential helpers may run (default: unless running as root).
    pub fn run_helpers(mut self, allow: bool) -> DockerCredentials {
        self.run_helpers = allow;
        self
    }

    /// The `PATH` to find `docker-credential-*` programs in (default: this
    /// process's `PATH`).
    pub fn helper_search_path(mut self, path: OsString) -> DockerCredentials {
        self.helper_path = Some(path);
        self
    }

    /// Asks helper `name` for `host`'s credential (cached per helper and host).
    fn ask_helper(&self, name: &str, host: &str) -> Option<Credential> {
        if !self.run_helpers {
            return None;
        }
        let key = (name.to_string(), host.to_string());
        let mut answers = self
            .helper_answers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        answers
            .entry(key)
            .or_insert_with(|| self.run_helper(name, host))
            .clone()
    }

    fn run_helper(&self, name: &str, host: &str) -> Option<Credential> {
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            eprintln!(
                "berth: warning: credential helper name '{name}' in {} is not valid; ignored",
                self.path.display()
            );
            return None;
        }
        let program = format!("docker-credential-{name}");
        let server = if host == "docker.io" {
            DOCKER_HUB_SERVER
        } else {
            host
        };
        let mut command = Command::new(&program);
        command
            .arg("get")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(path) = &self.helper_path {
            command.env("PATH", path);
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                eprintln!(
                    "berth: warning: cannot run credential helper {program} (named in {}): {e}; \
                     install it or remove it from the file",
                    self.path.display()
                );
                return None;
            }
        };
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(server.as_bytes());
        }
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if started.elapsed() < HELPER_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    eprintln!(
                        "berth: warning: credential helper {program} did not answer within {} s \
                         (waiting for a keychain prompt?); pulling without its credentials",
                        HELPER_TIMEOUT.as_secs()
                    );
                    return None;
                }
            }
        };
        if !status.success() {
            // "credentials not found" is the usual answer for other registries.
            return None;
        }
        // Answers are a few hundred bytes: they fit the pipe, so reading after exit is safe.
        let mut stdout = Vec::new();
        child.stdout.take()?.read_to_end(&mut stdout).ok()?;
        let answer: HelperAnswer = match serde_json::from_slice(&stdout) {
            Ok(a) => a,
            Err(e) => {
                eprintln!(
                    "berth: warning: credential helper {program} answered unreadable JSON: {e}"
                );
                return None;
            }
        };
        // "<token>" marks an identity token, which needs an OAuth2 exchange berth lacks.
        (answer.username != "<token>").then_some(Credential {
            login: answer.username,
            password: answer.secret,
        })
    }
}

impl AuthEntry {
    fn credential(self) -> Option<Credential> {
        if let (Some(login), Some(password)) = (&self.username, &self.password) {
            if !login.is_empty() {
                return Some(Credential {
                    login: login.clone(),
                    password: password.clone(),
                });
            }
        }
        let decoded = base64_decode(self.auth.as_deref()?.trim())?;
        let text = String::from_utf8(decoded).ok()?;
        let (login, password) = text.split_once(':')?;
        Some(Credential {
            login: login.to_string(),
            password: password.to_string(),
        })
    }
}

impl Credentials for DockerCredentials {
    fn lookup(&self, host: &str, user: Option<&str>) -> Option<Credential> {
        let host = normalize(host);
        let user_ok = |c: &Credential| user.is_none_or(|u| c.login == u);
        if let Some(helper) = self.cred_helpers.get(&host) {
            if let Some(c) = self.ask_helper(helper, &host).filter(user_ok) {
                return Some(c);
            }
        }
        if let Some(c) = self.auths.get(&host).filter(|c| user_ok(c)) {
            return Some(c.clone());
        }
        let store = self.creds_store.as_deref()?;
        self.ask_helper(store, &host).filter(user_ok)
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

/// A registry key as docker writes it (`https://host/v1/`, `host:port`) as
/// `host[:port]`; Docker Hub's names as `docker.io`.
fn normalize(key: &str) -> String {
    let key = key.trim();
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = key.split('/').next().unwrap_or(key);
    match host {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".to_string()
        }
        _ => host.to_string(),
    }
}

/// Several credential sources, asked in order.
#[derive(Debug)]
pub struct ChainedCredentials(pub Vec<std::sync::Arc<dyn Credentials>>);

impl Credentials for ChainedCredentials {
    fn lookup(&self, host: &str, user: Option<&str>) -> Option<Credential> {
        self.0.iter().find_map(|c| c.lookup(host, user))
    }

    fn describe(&self) -> String {
        self.0
            .iter()
            .map(|c| c.describe())
            .collect::<Vec<_>>()
            .join(" or ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::auth::base64;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;

    fn config(text: &str) -> DockerCredentials {
        DockerCredentials::from_text(Path::new("/home/u/.docker/config.json"), text)
    }

    #[test]
    fn auths_entries() {
        let text = format!(
            r#"{{"auths": {{
                "https://index.docker.io/v1/": {{"auth": "{}"}},
                "registry.example.org:5000": {{"username": "bob", "password": "pw"}},
                "http://plain.example.org/v2/": {{"auth": "{}"}},
                "broken.example.org": {{"auth": "not base64!"}},
                "token.example.org": {{"identitytoken": "x"}}
            }}}}"#,
            base64(b"alice:s3:cret"),
            base64(b"carol:c")
        );
        let c = config(&text);
        for hub in ["docker.io", "registry-1.docker.io", "index.docker.io"] {
            let cred = c.lookup(hub, None).unwrap();
            assert_eq!(
                (cred.login.as_str(), cred.password.as_str()),
                ("alice", "s3:cret")
            );
        }
        assert!(c.lookup("docker.io", Some("bob")).is_none());
        assert_eq!(
            c.lookup("registry.example.org:5000", None)
                .unwrap()
                .password,
            "pw"
        );
        assert!(c.lookup("registry.example.org", None).is_none());
        assert_eq!(c.lookup("plain.example.org", None).unwrap().login, "carol");
        assert!(c.lookup("broken.example.org", None).is_none());
        assert!(c.lookup("token.example.org", None).is_none());
        assert!(c.lookup("auth.docker.io", None).is_none());
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("s3:cret") && !debug.contains("pw\""),
            "{debug}"
        );
        assert!(config("not json").lookup("docker.io", None).is_none());
    }

    #[test]
    fn credential_helpers() {
        let bin = tempfile::tempdir().unwrap();
        let log = bin.path().join("asked");
        let script = format!(
            "#!/bin/sh\nread server\necho \"$1 $server\" >> {}\n\
             case \"$server\" in\n\
             https://index.docker.io/v1/) echo '{{\"ServerURL\":\"x\",\"Username\":\"hub\",\"Secret\":\"h\"}}' ;;\n\
             ghcr.io) echo '{{\"Username\":\"gh\",\"Secret\":\"g\"}}' ;;\n\
             id.example.org) echo '{{\"Username\":\"<token>\",\"Secret\":\"t\"}}' ;;\n\
             *) echo 'credentials not found in native keychain'; exit 1 ;;\n\
             esac\n",
            log.display()
        );
        for name in ["docker-credential-store", "docker-credential-gh"] {
            let path = bin.path().join(name);
            fs_write_exec(&path, &script);
        }
        let c = config(
            r#"{"credsStore": "store", "credHelpers": {"ghcr.io": "gh", "evil.org": "../x"},
                "auths": {"plain.example.org": {"auth": "dTpw"}}}"#,
        )
        .run_helpers(true)
        .helper_search_path(bin.path().as_os_str().to_owned());
        assert_eq!(c.lookup("docker.io", None).unwrap().login, "hub");
        assert_eq!(c.lookup("docker.io", None).unwrap().password, "h");
        assert_eq!(c.lookup("ghcr.io", None).unwrap().login, "gh");
        assert_eq!(c.lookup("plain.example.org", None).unwrap().login, "u");
        assert!(c.lookup("other.org", None).is_none());
        assert!(c.lookup("id.example.org", None).is_none());
        assert!(c.lookup("evil.org", None).is_none());
        let asked = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            asked
                .lines()
                .filter(|l| l.contains("index.docker.io"))
                .count(),
            1,
            "cached: {asked}"
        );
        assert!(asked.lines().all(|l| l.starts_with("get ")), "{asked}");

        // Without permission (root's default) no helper runs.
        let quiet = config(r#"{"credsStore": "store"}"#)
            .run_helpers(false)
            .helper_search_path(bin.path().as_os_str().to_owned());
        assert!(quiet.lookup("docker.io", None).is_none());

        let chain = ChainedCredentials(vec![Arc::new(super::super::NoCredentials), Arc::new(c)]);
        assert_eq!(chain.lookup("ghcr.io", None).unwrap().login, "gh");
        assert!(chain.describe().contains(" or /home/u/.docker/config.json"));
    }

    fn fs_write_exec(path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn default_path() {
        // Only the shape: the environment belongs to the whole test process.
        if let Some(p) = DockerCredentials::default_path() {
            assert!(p.ends_with("config.json"), "{}", p.display());
        }
    }
}
