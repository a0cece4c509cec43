//! A user's registry credentials on their way to the puller: looked up by
//! `berth __credentials` running as the user (the user's own file
//! permissions, the user's docker credential helpers), written to a pipe,
//! read by `berth pull --credentials-stdin`. Never in argv, the environment
//! or a log; `Debug` prints no secret.

use std::fmt;
use std::io::Read;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::reference::ImageRef;
use crate::registry::{Credential, Credentials};

/// The most bytes of credentials read from the pipe.
pub const MAX_WIRE_BYTES: u64 = 256 << 10;

/// Token services on another host than their registry, as enroot's
/// documentation names them: an entry for either host is used.
const TOKEN_HOSTS: &[(&str, &str)] = &[
    ("docker.io", "auth.docker.io"),
    ("nvcr.io", "authn.nvidia.com"),
];

/// One host's credential.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCredential {
    /// `host[:port]` it was looked up for.
    pub host: String,
    /// The login.
    pub login: String,
    /// The password or token.
    pub password: String,
}

impl fmt::Debug for HostCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostCredential")
            .field("host", &self.host)
            .field("login", &self.login)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// What goes over the pipe.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialSet {
    /// Where they were read, for error messages (the user's files).
    pub sources: String,
    /// The credentials found, one per host.
    pub credentials: Vec<HostCredential>,
}

impl CredentialSet {
    /// Looks up each of `hosts` in `source` (with the login `user`, if any).
    pub fn collect(
        source: &dyn Credentials,
        hosts: &[String],
        user: Option<&str>,
    ) -> CredentialSet {
        let credentials = hosts
            .iter()
            .filter_map(|host| {
                source.lookup(host, user).map(|c| HostCredential {
                    host: host.clone(),
                    login: c.login,
                    password: c.password,
                })
            })
            .collect();
        CredentialSet {
            sources: source.describe(),
            credentials,
        }
    }

    /// The bytes for the pipe.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Fails when this process is being traced (`TracerPid` of
    /// `/proc/self/status` is not 0). The puller calls it after making
    /// itself non-dumpable and before reading credentials: a process of the
    /// pull user that attached before that (a hostile, resident one) could
    /// read them from its memory.
    pub fn refuse_if_traced() -> Result<()> {
        let status = std::fs::read_to_string("/proc/self/status")
            .context("cannot read /proc/self/status")?;
        match tracer_pid(&status) {
            Some(0) => Ok(()),
            Some(pid) => bail!(
                "the puller is being traced by process {pid}: it refuses to read credentials \
                 (a process of the pull user attached to it)"
            ),
            None => bail!("/proc/self/status has no TracerPid line"),
        }
    }

    /// Reads a set from `reader` (at most [`MAX_WIRE_BYTES`]); an empty
    /// input is an empty set.
    pub fn read_from(reader: impl Read) -> Result<CredentialSet> {
        let mut bytes = Vec::new();
        reader
            .take(MAX_WIRE_BYTES + 1)
            .read_to_end(&mut bytes)
            .context("cannot read the credentials pipe")?;
        if bytes.len() as u64 > MAX_WIRE_BYTES {
            bail!("the credentials pipe carried more than {MAX_WIRE_BYTES} bytes");
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(CredentialSet::default());
        }
        // serde_json's message may quote the input: keep it out of the error.
        serde_json::from_slice(&bytes)
            .map_err(|_| anyhow::anyhow!("the credentials pipe carried unreadable data"))
    }

    /// The set as a credentials source for the registry client.
    pub fn into_source(self) -> Arc<dyn Credentials> {
        Arc::new(PipeCredentials(self))
    }
}

/// Credentials received over the pipe: exact host matches only (the sender
/// already applied its file's matching rules).
#[derive(Debug)]
struct PipeCredentials(CredentialSet);

impl Credentials for PipeCredentials {
    fn lookup(&self, host: &str, user: Option<&str>) -> Option<Credential> {
        self.0
            .credentials
            .iter()
            .find(|c| c.host == host && user.is_none_or(|u| c.login == u))
            .map(|c| Credential {
                login: c.login.clone(),
                password: c.password.clone(),
            })
    }

    fn describe(&self) -> String {
        if self.0.sources.is_empty() {
            "your credentials files".to_string()
        } else {
            self.0.sources.clone()
        }
    }
}

/// The hosts whose credentials a pull of `image` may need: the registry
/// (as written and its API host), its mirrors, and a token service on
/// another host that enroot's documentation names.
pub fn hosts_for(image: &ImageRef, mirrors: &[(String, String)]) -> Vec<String> {
    let mut hosts = vec![image.api_host().to_string(), image.registry.clone()];
    for (registry, mirror) in mirrors {
        if *registry == image.registry {
            hosts.push(mirror.clone());
        }
    }
    for (registry, token) in TOKEN_HOSTS {
        if *registry == image.registry {
            hosts.push(token.to_string());
        }
    }
    let mut seen = Vec::new();
    hosts.retain(|h| {
        let new = !seen.contains(h);
        seen.push(h.clone());
        new
    });
    hosts
}

/// The `TracerPid` of a `/proc/PID/status` text.
fn tracer_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracer_pid_is_read_from_status() {
        assert_eq!(tracer_pid("Name:\tx\nTracerPid:\t0\nUid:\t1\n"), Some(0));
        assert_eq!(tracer_pid("TracerPid:\t4242\n"), Some(4242));
        assert_eq!(tracer_pid("Name:\tx\n"), None);
    }

    /// Untraced, the check passes; traced (PTRACE_TRACEME: the test process
    /// is the tracer), it refuses.
    #[test]
    fn a_traced_puller_refuses_credentials() {
        CredentialSet::refuse_if_traced().unwrap();
        // SAFETY: the child only makes a raw ptrace call, reads a file and
        // exits; it allocates, which is fine in practice for a test child.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                // SAFETY: PTRACE_TRACEME takes no further arguments.
                let traced = unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) } == 0;
                let code = match (traced, CredentialSet::refuse_if_traced()) {
                    (false, _) => 2,
                    (true, Ok(())) => 1,
                    (true, Err(_)) => 0,
                };
                // SAFETY: _exit is always safe.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
            }
        }
    }
    use crate::registry::EnrootCredentials;
    use std::path::Path;

    #[test]
    fn round_trip_without_secrets_in_debug() {
        let file = EnrootCredentials::from_text(
            Path::new("/home/u/.config/enroot/.credentials"),
            "machine reg.example:5000 login alice password s3cret\nmachine other.example login bob password other\n",
        );
        let hosts = vec![
            "reg.example:5000".to_string(),
            "missing.example".to_string(),
        ];
        let set = CredentialSet::collect(&file, &hosts, None);
        assert_eq!(set.credentials.len(), 1);
        assert!(!format!("{set:?}").contains("s3cret"), "{set:?}");
        let back = CredentialSet::read_from(&set.encode()[..]).unwrap();
        assert_eq!(back, set);
        let source = back.into_source();
        assert_eq!(
            source.lookup("reg.example:5000", None).unwrap().password,
            "s3cret"
        );
        assert!(source.lookup("reg.example:5000", Some("eve")).is_none());
        assert!(
            source.lookup("other.example", None).is_none(),
            "only the hosts asked for travel"
        );
        assert!(source.describe().contains(".credentials"));
        assert_eq!(
            CredentialSet::read_from(&b""[..]).unwrap(),
            CredentialSet::default()
        );
        let e = CredentialSet::read_from(&b"{\"password\": \"leak\""[..]).unwrap_err();
        assert!(!format!("{e:#}").contains("leak"), "{e:#}");
        let huge = vec![b' '; MAX_WIRE_BYTES as usize + 10];
        assert!(CredentialSet::read_from(&huge[..]).is_err());
    }

    #[test]
    fn hosts_follow_the_registry_and_its_mirrors() {
        let image = ImageRef::parse("docker.io/library/busybox:latest").unwrap();
        let mirrors = vec![
            ("docker.io".to_string(), "mirror.site:5000".to_string()),
            ("ghcr.io".to_string(), "other:1".to_string()),
        ];
        let hosts = hosts_for(&image, &mirrors);
        assert!(hosts.contains(&"docker.io".to_string()), "{hosts:?}");
        assert!(hosts.contains(&"mirror.site:5000".to_string()), "{hosts:?}");
        assert!(hosts.contains(&"auth.docker.io".to_string()), "{hosts:?}");
        assert!(!hosts.contains(&"other:1".to_string()), "{hosts:?}");
        let local = ImageRef::parse("10.0.0.1:5000/private/x:1").unwrap();
        assert_eq!(hosts_for(&local, &[]), vec!["10.0.0.1:5000".to_string()]);
    }
}
