//! The typed channel between the caller and the holder process: one JSON
//! message per line over a unix socket pair.

use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::container::entrypoint::EntrypointOutcome;
use crate::container::spec::{ContainerSpec, Mode};

/// Messages from the caller to the holder, in the order they are sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToHolder {
    /// Build this container, with privileges of this kind.
    Start {
        /// The container to build.
        spec: Box<ContainerSpec>,
        /// Root-driven or user-driven setup.
        mode: Mode,
    },
    /// The uid and gid maps of the holder's user namespace are written.
    MapsWritten,
    /// The caller holds the namespaces now; the holder may exit.
    Release,
}

/// Messages from the holder to the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromHolder {
    /// The holder made its user namespace; write its uid and gid maps.
    NeedMaps {
        /// The holder's process id.
        pid: i32,
    },
    /// The container is built: open `/proc/<pid>/ns/*` now.
    Ready {
        /// The holder's process id.
        pid: i32,
        /// FUSE daemons serving the container (unprivileged mode); the caller
        /// stops them when it is done with the container.
        fuse_pids: Vec<i32>,
        /// What the image ENTRYPOINT left, when the spec asked to run it.
        entrypoint: Option<EntrypointOutcome>,
        /// Things the user should know (the image could not be idmapped).
        #[serde(default)]
        warnings: Vec<String>,
        /// What the holder mounted, one fstab-like line each, in order.
        #[serde(default)]
        mount_table: Vec<String>,
        /// Variables the site's hooks appended (`NAME=VALUE`), for every task.
        #[serde(default)]
        hook_env: Vec<String>,
    },
    /// Setup failed; `error` names the failing step and path.
    Failed {
        /// What went wrong, for the user.
        error: String,
    },
}

/// One end of the socket pair, sending and receiving JSON lines.
#[derive(Debug)]
pub struct Channel {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Channel {
    /// Wraps a connected stream socket.
    pub fn new(stream: UnixStream) -> anyhow::Result<Channel> {
        let writer = stream
            .try_clone()
            .context("cannot duplicate the holder channel socket")?;
        Ok(Channel {
            reader: BufReader::new(stream),
            writer,
        })
    }

    /// Fails `recv` calls that wait longer than `timeout`.
    pub fn set_timeout(&self, timeout: Duration) -> anyhow::Result<()> {
        self.writer
            .set_read_timeout(Some(timeout))
            .context("cannot set a timeout on the holder channel")
    }

    /// Sends one message.
    pub fn send<T: Serialize>(&mut self, message: &T) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(message).context("cannot encode a holder message")?;
        line.push(b'\n');
        send_all(&self.writer, &line)
            .context("cannot send a message on the holder channel (did the other side exit?)")
    }

    /// Receives one message; fails when the other side closed the channel.
    pub fn recv<T: DeserializeOwned>(&mut self) -> anyhow::Result<T> {
        let mut line = String::new();
        let read = self
            .reader
            .read_line(&mut line)
            .context("cannot read from the holder channel")?;
        if read == 0 {
            bail!("the other side of the holder channel exited without a word");
        }
        serde_json::from_str(&line)
            .with_context(|| format!("malformed holder message: {}", line.trim_end()))
    }
}

/// Writes all of `bytes` with MSG_NOSIGNAL: a peer that exited must give us
/// EPIPE, never a SIGPIPE (which would kill slurmstepd, whose handler we do
/// not control).
fn send_all(socket: &UnixStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe the live slice `bytes`.
        let sent = unsafe {
            libc::send(
                socket.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if sent < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        bytes = &bytes[sent as usize..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::spec::UserIdentity;
    use crate::image::ImageConfig;

    #[test]
    fn messages_cross_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut parent = Channel::new(a).unwrap();
        let mut holder = Channel::new(b).unwrap();
        let user = UserIdentity {
            uid: 1,
            gid: 1,
            groups: vec![1],
            name: "u".into(),
            home: "/".into(),
            shell: "/bin/sh".into(),
            group_names: Default::default(),
        };
        let start = ToHolder::Start {
            spec: Box::new(ContainerSpec::new(
                "/i.sqfs".into(),
                ImageConfig::default(),
                user,
            )),
            mode: Mode::Privileged,
        };
        parent.send(&start).unwrap();
        assert_eq!(holder.recv::<ToHolder>().unwrap(), start);
        holder.send(&FromHolder::NeedMaps { pid: 42 }).unwrap();
        holder
            .send(&FromHolder::Failed {
                error: "line\nbreak".into(),
            })
            .unwrap();
        assert_eq!(
            parent.recv::<FromHolder>().unwrap(),
            FromHolder::NeedMaps { pid: 42 }
        );
        assert_eq!(
            parent.recv::<FromHolder>().unwrap(),
            FromHolder::Failed {
                error: "line\nbreak".into()
            }
        );
        drop(holder);
        let err = parent.recv::<FromHolder>().unwrap_err();
        assert!(err.to_string().contains("exited"), "{err}");
    }
}
