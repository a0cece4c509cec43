//! Registry credentials: the [`Credentials`] trait and enroot's credentials file.
//!
//! enroot's file is netrc-like, one entry per line:
//! `machine HOST login USER password PASS`. Like enroot (whose curl reads it as a
//! netrc), berth looks up both the registry host and the host of its token
//! service, so `machine auth.docker.io ...` works for Docker Hub and
//! `machine authn.nvidia.com ...` for nvcr.io. Secrets never appear in `Debug`
//! output, logs or error messages.

use std::fmt;
use std::path::{Path, PathBuf};

/// A login and password (or token) for one host.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// The login (user name; `$oauthtoken` for NGC API keys).
    pub login: String,
    /// The password or token.
    pub password: String,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("login", &self.login)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Where registry credentials come from.
pub trait Credentials: Send + Sync + fmt::Debug {
    /// The credential for `host` (a registry or token service host, with port if
    /// any); when `user` is given, only an entry with that login matches.
    fn lookup(&self, host: &str, user: Option<&str>) -> Option<Credential>;

    /// Where the credentials live, for error messages ("check credentials in ...").
    fn describe(&self) -> String;
}

/// No credentials: anonymous access only.
#[derive(Debug, Clone, Default)]
pub struct NoCredentials;

impl Credentials for NoCredentials {
    fn lookup(&self, _host: &str, _user: Option<&str>) -> Option<Credential> {
        None
    }

    fn describe(&self) -> String {
        "(no credentials configured)".to_string()
    }
}

/// One `machine` entry of a credentials file.
#[derive(Clone, PartialEq, Eq)]
struct Entry {
    /// `None` for a `default` entry.
    machine: Option<String>,
    credential: Credential,
}

/// enroot's credentials file, read once when constructed.
#[derive(Clone)]
pub struct EnrootCredentials {
    path: PathBuf,
    entries: Vec<Entry>,
}

impl fmt::Debug for EnrootCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnrootCredentials")
            .field("path", &self.path)
            .field("entries", &self.entries.len())
            .finish()
    }
}

impl EnrootCredentials {
    /// The file enroot reads: `$ENROOT_CONFIG_PATH/.credentials`, else
    /// `$XDG_CONFIG_HOME/enroot/.credentials`, else
    /// `$HOME/.config/enroot/.credentials`.
    pub fn default_path() -> Option<PathBuf> {
        let config_path = std::env::var_os("ENROOT_CONFIG_PATH")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("XDG_CONFIG_HOME")
                    .filter(|d| !d.is_empty())
                    .map(|d| PathBuf::from(d).join("enroot"))
            });
        Self::path_from(config_path, std::env::var_os("HOME").map(PathBuf::from))
    }

    /// The credentials file given enroot's config directory and a home directory
    /// (for callers that act for another user, such as the SPANK plugin).
    pub fn path_from(config_path: Option<PathBuf>, home: Option<PathBuf>) -> Option<PathBuf> {
        match (config_path, home) {
            (Some(dir), _) if !dir.as_os_str().is_empty() => Some(dir.join(".credentials")),
            (_, Some(home)) if !home.as_os_str().is_empty() => {
                Some(home.join(".config/enroot/.credentials"))
            }
            _ => None,
        }
    }

    /// Reads the file at the default path; a missing file means no credentials.
    pub fn from_env() -> EnrootCredentials {
        match Self::default_path() {
            Some(path) => Self::load(&path),
            None => EnrootCredentials {
                path: PathBuf::from("$HOME/.config/enroot/.credentials"),
                entries: Vec::new(),
            },
        }
    }

    /// Reads `path`; a missing or unreadable file means no credentials (a warning
    /// is printed for unreadable files other than missing ones).
    pub fn load(path: &Path) -> EnrootCredentials {
        let entries = match std::fs::read_to_string(path) {
            Ok(text) => parse(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                eprintln!(
                    "berth: warning: cannot read credentials file {}: {e}; pulling anonymously",
                    path.display()
                );
                Vec::new()
            }
        };
        EnrootCredentials {
            path: path.to_path_buf(),
            entries,
        }
    }

    /// Parses credentials from text (as if read from `path`).
    pub fn from_text(path: &Path, text: &str) -> EnrootCredentials {
        EnrootCredentials {
            path: path.to_path_buf(),
            entries: parse(text),
        }
    }
}

impl Credentials for EnrootCredentials {
    fn lookup(&self, host: &str, user: Option<&str>) -> Option<Credential> {
        let user_ok = |e: &&Entry| user.is_none_or(|u| e.credential.login == u);
        // Like curl's netrc, a `machine` without a port matches every port.
        let host_only = host.rsplit_once(':').map_or(host, |(h, _)| h);
        let find = |name: &str| {
            self.entries
                .iter()
                .filter(user_ok)
                .find(|e| e.machine.as_deref() == Some(name))
        };
        find(host)
            .or_else(|| find(host_only))
            .or_else(|| {
                self.entries
                    .iter()
                    .filter(user_ok)
                    .find(|e| e.machine.is_none())
            })
            .map(|e| e.credential.clone())
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

/// Splits netrc text into tokens: whitespace separated, `"quoted strings"` with
/// backslash escapes, `#` comments to the end of the line.
fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut chars = line.chars().peekable();
        loop {
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
            match chars.peek() {
                None => break,
                Some('#') => break,
                Some('"') => {
                    chars.next();
                    let mut tok = String::new();
                    while let Some(c) = chars.next() {
                        match c {
                            '"' => break,
                            '\\' => tok.extend(chars.next()),
                            c => tok.push(c),
                        }
                    }
                    out.push(tok);
                }
                Some(_) => {
                    let mut tok = String::new();
                    while let Some(&c) = chars.peek() {
                        if c.is_whitespace() {
                            break;
                        }
                        tok.push(c);
                        chars.next();
                    }
                    out.push(tok);
                }
            }
        }
    }
    out
}

fn parse(text: &str) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut current: Option<(Option<String>, Option<String>, Option<String>)> = None;
    let mut flush = |cur: &mut Option<(Option<String>, Option<String>, Option<String>)>| {
        if let Some((machine, Some(login), Some(password))) = cur.take() {
            entries.push(Entry {
                machine,
                credential: Credential { login, password },
            });
        }
    };
    let toks = tokens(text);
    let mut it = toks.into_iter();
    while let Some(tok) = it.next() {
        match tok.as_str() {
            "machine" => {
                flush(&mut current);
                current = Some((it.next(), None, None));
            }
            "default" => {
                flush(&mut current);
                current = Some((None, None, None));
            }
            "login" => {
                if let Some(cur) = current.as_mut() {
                    cur.1 = it.next();
                }
            }
            "password" => {
                if let Some(cur) = current.as_mut() {
                    cur.2 = it.next();
                }
            }
            "account" => {
                it.next();
            }
            _ => {}
        }
    }
    flush(&mut current);
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
# NGC (both hosts)
machine nvcr.io login $oauthtoken password nvapi-SECRET
machine authn.nvidia.com login $oauthtoken password nvapi-SECRET
machine auth.docker.io login alice password "pa ss\"word"
machine auth.docker.io login bob password bobpw
machine localhost:5000
    login carol
    password c4r0l
"#;

    fn creds() -> EnrootCredentials {
        EnrootCredentials::from_text(Path::new("/home/u/.config/enroot/.credentials"), FILE)
    }

    #[test]
    fn lookups() {
        let c = creds();
        let ngc = c.lookup("nvcr.io", None).unwrap();
        assert_eq!(ngc.login, "$oauthtoken");
        assert_eq!(ngc.password, "nvapi-SECRET");
        assert_eq!(
            c.lookup("auth.docker.io", None).unwrap().password,
            "pa ss\"word"
        );
        assert_eq!(
            c.lookup("auth.docker.io", Some("bob")).unwrap().password,
            "bobpw"
        );
        assert!(c.lookup("auth.docker.io", Some("eve")).is_none());
        assert_eq!(c.lookup("localhost:5000", None).unwrap().login, "carol");
        assert!(c.lookup("localhost", None).is_none());
        assert!(c.lookup("example.com", None).is_none());
        // A machine without a port matches the host on any port, as in curl.
        assert_eq!(
            c.lookup("nvcr.io:443", None).unwrap().password,
            "nvapi-SECRET"
        );
    }

    #[test]
    fn default_entry_and_paths() {
        let c = EnrootCredentials::from_text(Path::new("x"), "default login d password p");
        assert_eq!(c.lookup("any.host", None).unwrap().login, "d");
        assert_eq!(
            EnrootCredentials::path_from(Some("/cfg".into()), Some("/home/u".into())),
            Some(PathBuf::from("/cfg/.credentials"))
        );
        assert_eq!(
            EnrootCredentials::path_from(None, Some("/home/u".into())),
            Some(PathBuf::from("/home/u/.config/enroot/.credentials"))
        );
        assert_eq!(EnrootCredentials::path_from(None, None), None);
        let missing = EnrootCredentials::load(Path::new("/nonexistent/berth/.credentials"));
        assert!(missing.lookup("nvcr.io", None).is_none());
    }

    #[test]
    fn secrets_stay_out_of_debug() {
        let c = creds();
        let all = format!("{c:?} {:?}", c.lookup("nvcr.io", None).unwrap());
        assert!(!all.contains("SECRET") && !all.contains("bobpw"), "{all}");
    }
}
