//! Registry credentials: the [`Credentials`] trait and enroot's credentials file.
//!
//! enroot's file is netrc-like, one entry per line:
//! `machine HOST login USER password PASS`. Like enroot (whose curl reads it as a
//! netrc), berth looks up both the registry host and the host of its token
//! service, so `machine auth.docker.io ...` works for Docker Hub and
//! `machine authn.nvidia.com ...` for nvcr.io. Secrets never appear in `Debug`
//! output, logs or error messages.
//!
//! A password that starts with `$` (`password $(gcloud auth print-access-token)`,
//! `password $NGC_KEY`) is evaluated the way enroot does it: the rest of the
//! line goes to `/bin/sh -c 'echo ...'` and the output is the password. berth
//! runs it only for the entry a lookup picks, once, as whoever reads the file
//! (in Slurm: the job's user, in `berth __credentials`), bounded in time
//! ([`PASSWORD_COMMAND_TIMEOUT`]) and output.

use std::fmt;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a `password $(...)` command may run before it is killed.
pub const PASSWORD_COMMAND_TIMEOUT: Duration = Duration::from_secs(20);

/// The most bytes of a password command's output that are read.
const MAX_PASSWORD_BYTES: u64 = 64 << 10;

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
#[derive(Clone)]
struct Entry {
    /// `None` for a `default` entry.
    machine: Option<String>,
    login: String,
    password: Password,
}

/// A password as written in the file.
#[derive(Clone)]
enum Password {
    /// Taken as it is.
    Plain(String),
    /// `$...` to the end of the line: shell words that `echo` expands, run
    /// at the first lookup that picks the entry (the result is kept).
    Command {
        words: String,
        result: OnceLock<Option<String>>,
    },
}

impl Entry {
    /// The credential, running the password command if there is one; a
    /// failed command is reported (without its output) and gives `None`.
    fn credential(&self, file: &Path) -> Option<Credential> {
        let password = match &self.password {
            Password::Plain(p) => p.clone(),
            Password::Command { words, result } => result
                .get_or_init(|| {
                    let machine = self.machine.as_deref().unwrap_or("default");
                    match run_password_command(words, PASSWORD_COMMAND_TIMEOUT) {
                        Ok(password) => Some(password),
                        Err(why) => {
                            eprintln!(
                                "berth: warning: the password command of `machine {machine}` in \
                                 {} {why}; not using that entry (check the command by running \
                                 it in a shell)",
                                file.display()
                            );
                            None
                        }
                    }
                })
                .clone()?,
        };
        Some(Credential {
            login: self.login.clone(),
            password,
        })
    }
}

/// Runs `echo WORDS` in `/bin/sh` (so `$(cmd)` and `$VAR` expand, as in
/// enroot) for at most `limit`; returns its output without the trailing
/// newline.
fn run_password_command(words: &str, limit: Duration) -> Result<String, String> {
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("echo {words}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("could not be started (/bin/sh: {e})"))?;
    let stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(pipe) = stdout {
            let _ = pipe.take(MAX_PASSWORD_BYTES + 1).read_to_end(&mut bytes);
        }
        bytes
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > limit => {
                kill_group(&child);
                let _ = child.wait();
                let _ = reader.join();
                return Err(format!(
                    "did not finish within {:.1} s and was killed",
                    limit.as_secs_f64()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("could not be waited for: {e}")),
        }
    };
    // Children the command left behind keep the pipe open: end them too.
    kill_group(&child);
    let bytes = reader.join().unwrap_or_default();
    if !status.success() {
        return Err(format!("failed ({status})"));
    }
    if bytes.len() as u64 > MAX_PASSWORD_BYTES {
        return Err(format!("printed more than {MAX_PASSWORD_BYTES} bytes"));
    }
    let text =
        String::from_utf8(bytes).map_err(|_| "printed bytes that are not UTF-8".to_string())?;
    let password = text.trim_end_matches(['\n', '\r']).to_string();
    if password.is_empty() {
        return Err("printed an empty password".to_string());
    }
    Ok(password)
}

/// Sends SIGKILL to the process group that `child` leads.
fn kill_group(child: &std::process::Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) with a negative pid signals the process group the
        // child was put in (`process_group(0)`); no memory is involved.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
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
        let user_ok = |e: &&Entry| user.is_none_or(|u| e.login == u);
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
            .and_then(|e| e.credential(&self.path))
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

/// One token of a credentials file.
#[derive(Debug, PartialEq, Eq)]
enum Token {
    /// A word (quotes removed).
    Word(String),
    /// After `password`: `$...` to the end of the line, to be evaluated.
    Command(String),
}

/// Splits netrc text into tokens: whitespace separated, `"quoted strings"` with
/// backslash escapes, `#` comments to the end of the line; a password that
/// starts with `$` takes the rest of its line (enroot's form).
fn tokens(text: &str) -> Vec<Token> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut chars = line.chars().peekable();
        loop {
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
            let after_password = matches!(out.last(), Some(Token::Word(w)) if w == "password");
            match chars.peek() {
                None => break,
                Some('$') if after_password => {
                    out.push(Token::Command(
                        chars.by_ref().collect::<String>().trim_end().to_string(),
                    ));
                    break;
                }
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
                    out.push(Token::Word(tok));
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
                    out.push(Token::Word(tok));
                }
            }
        }
    }
    out
}

fn parse(text: &str) -> Vec<Entry> {
    /// The entry being read: machine (`None`: default), login, password.
    type Partial = (Option<String>, Option<String>, Option<Password>);
    let mut entries = Vec::new();
    let mut current: Option<Partial> = None;
    let mut flush = |cur: &mut Option<Partial>| {
        if let Some((machine, Some(login), Some(password))) = cur.take() {
            entries.push(Entry {
                machine,
                login,
                password,
            });
        }
    };
    let word = |tok: Option<Token>| match tok {
        Some(Token::Word(w)) => Some(w),
        Some(Token::Command(c)) => Some(c),
        None => None,
    };
    let mut it = tokens(text).into_iter();
    while let Some(tok) = it.next() {
        let Token::Word(tok) = tok else { continue };
        match tok.as_str() {
            "machine" => {
                flush(&mut current);
                current = Some((word(it.next()), None, None));
            }
            "default" => {
                flush(&mut current);
                current = Some((None, None, None));
            }
            "login" => {
                let login = word(it.next());
                if let Some(cur) = current.as_mut() {
                    cur.1 = login;
                }
            }
            "password" => {
                let password = match it.next() {
                    Some(Token::Word(w)) => Some(Password::Plain(w)),
                    Some(Token::Command(words)) => Some(Password::Command {
                        words,
                        result: OnceLock::new(),
                    }),
                    None => None,
                };
                if let Some(cur) = current.as_mut() {
                    cur.2 = password;
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
    #[test]
    fn a_dollar_password_is_evaluated_like_enroot() {
        let c = EnrootCredentials::from_text(
            Path::new("x"),
            "machine a.io login $oauthtoken password $(printf 'tok%s' en)\n\
             machine b.io login u password $(echo two words)   \n",
        );
        let a = c.lookup("a.io", None).unwrap();
        assert_eq!(
            (a.login.as_str(), a.password.as_str()),
            ("$oauthtoken", "token")
        );
        assert_eq!(c.lookup("b.io", None).unwrap().password, "two words");
    }

    #[test]
    fn a_password_command_runs_only_for_the_entry_picked_and_once() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("ran");
        let text = format!(
            "machine other.io login o password $(echo other >> {log}; echo o)\n\
             machine my.io login m password $(echo mine >> {log}; echo m)\n",
            log = log.display()
        );
        let c = EnrootCredentials::from_text(Path::new("x"), &text);
        assert!(!log.exists(), "no command runs when the file is read");
        assert_eq!(c.lookup("my.io", None).unwrap().password, "m");
        assert_eq!(c.lookup("my.io", None).unwrap().password, "m");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "mine\n");
        let shown = format!("{c:?} {:?}", c.lookup("my.io", None).unwrap());
        assert!(
            !shown.contains("mine") && !shown.contains("echo"),
            "{shown}"
        );
    }

    #[test]
    fn a_failing_or_hanging_password_command_gives_no_credential() {
        let c = EnrootCredentials::from_text(
            Path::new("x"),
            "machine f.io login u password $(false)\nmachine e.io login u password $(true)\n",
        );
        assert!(
            c.lookup("f.io", None).is_none(),
            "an empty output is no password"
        );
        assert!(c.lookup("e.io", None).is_none());
        // As in enroot, the status is echo's: a failed command shows as an
        // empty password, and that is refused.
        assert!(
            run_password_command("$(echo >&2 no key; exit 3)", PASSWORD_COMMAND_TIMEOUT)
                .unwrap_err()
                .contains("empty")
        );
        let started = Instant::now();
        let err =
            run_password_command("$(sleep 30 & sleep 30)", Duration::from_millis(300)).unwrap_err();
        assert!(err.contains("killed"), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn quoted_and_plain_passwords_keep_their_meaning() {
        assert_eq!(
            tokens("machine h login u password \"$(not run)\" # c"),
            ["machine", "h", "login", "u", "password", "$(not run)"]
                .map(|w| Token::Word(w.to_string()))
        );
        assert_eq!(
            tokens("login $oauthtoken password $(a b) # c"),
            vec![
                Token::Word("login".into()),
                Token::Word("$oauthtoken".into()),
                Token::Word("password".into()),
                Token::Command("$(a b) # c".into()),
            ]
        );
    }
}
