//! `SlurmdParameters=contain_spank` (Slurm 24.05 and later): slurmstepd
//! runs `user_init` and `task_exit` in a `clone(CLONE_VM)` of itself that
//! joined the job's namespace, with a file table of its own (no
//! `CLONE_FILES`). The memory is shared, so the step's container reaches
//! slurmstepd, but the descriptors opened in the clone (the container's
//! namespaces, the image hold) close when the clone exits.
//!
//! The way across: a socket pair made in slurmstepd in `init`, before any
//! clone ([`open`]). The clone sends its descriptors over it with
//! `SCM_RIGHTS` ([`send`]); while the message sits in the socket, the kernel
//! keeps those files (namespaces, locks) alive. Each task, forked from
//! slurmstepd, peeks at the message ([`peek`]: `MSG_PEEK` installs a fresh
//! copy of every descriptor in the peeking process) and uses its own copies;
//! a later step joining the container as a named one copies slurmstepd's
//! receiving end out of it and peeks too ([`crate::named::running`]).
//! slurmstepd's `exit` closes the pair, which lets the files go.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::fdpass;
use crate::step::HeldElsewhere;

/// The socket pair: (sending end, receiving end).
static CHANNEL: OnceLock<(OwnedFd, OwnedFd)> = OnceLock::new();

/// Set by a `user_init` that ran in a clone and sent its descriptors: the
/// container's descriptor numbers are the clone's, not this process's.
static SENT: AtomicBool = AtomicBool::new(false);

/// Makes the socket pair (slurmstepd's `init`).
pub fn open() -> Result<(), String> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: socketpair writes two descriptors into the array it is given.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "cannot create the socket pair for contain_spank: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: both descriptors were just created and belong to nobody else.
    let pair = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let _ = CHANNEL.set(pair);
    Ok(())
}

/// Whether the container's descriptors came through the socket pair.
pub fn sent() -> bool {
    SENT.load(Ordering::SeqCst)
}

/// Sends `fds` (the clone's own) to slurmstepd's socket pair; returns where
/// they are held now: slurmstepd (`stepd_pid`), in the queue of its
/// receiving end, which a step joining the container later copies out.
pub fn send(fds: &[RawFd], stepd_pid: u32) -> Result<HeldElsewhere, String> {
    let (tx, rx) = CHANNEL
        .get()
        .ok_or("contain_spank: no socket pair was made in init")?;
    fdpass::send(tx.as_fd(), fds)
        .map_err(|e| format!("contain_spank: cannot send the container's descriptors: {e}"))?;
    SENT.store(true, Ordering::SeqCst);
    let channel_inode = nix::sys::stat::fstat(rx.as_raw_fd())
        .map_err(|e| format!("contain_spank: cannot stat the socket pair: {e}"))?
        .st_ino;
    Ok(HeldElsewhere {
        pid: stepd_pid as i32,
        channel_fd: rx.as_raw_fd(),
        channel_inode,
    })
}

/// This process's own copies of the sent descriptors, in the order sent
/// (close-on-exec). Leaves the message for the next task.
pub fn peek() -> Result<Vec<OwnedFd>, String> {
    let (_, rx) = CHANNEL
        .get()
        .ok_or("contain_spank: no socket pair was made in init")?;
    fdpass::peek(rx.as_fd())
        .map_err(|e| format!("contain_spank: no container descriptors from user_init: {e}"))
}

/// Closes the socket pair (slurmstepd's `exit`): the files sent go.
pub fn close() {
    // The pair lives in a OnceLock for the process's life; closing the
    // receiving end's queue is done by reading the message away.
    if let Some((_, rx)) = CHANNEL.get() {
        let mut data = [0u8];
        // SAFETY: a plain non-blocking read of one byte from our socket;
        // descriptors in the message are discarded by the kernel (no
        // control buffer is given).
        unsafe {
            libc::recv(
                rx.as_raw_fd(),
                data.as_mut_ptr().cast(),
                1,
                libc::MSG_DONTWAIT,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// What one process sends, each peek gets a fresh copy of, and the
    /// message stays while the sender's copies are closed (what keeps a
    /// namespace and a lock alive after the clone exits).
    #[test]
    fn every_peek_gets_its_own_copies_of_what_was_sent() {
        open().unwrap();
        let ns = std::fs::File::open("/proc/self/ns/mnt").unwrap();
        let inode = ns.metadata().unwrap().ino();
        let held = send(&[ns.as_raw_fd()], std::process::id()).unwrap();
        assert_eq!(held.pid, std::process::id() as i32);
        assert!(sent());
        drop(ns);
        let first = peek().unwrap();
        let second = peek().unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(second.len(), 1);
        assert_ne!(first[0].as_raw_fd(), second[0].as_raw_fd());
        for fd in first.iter().chain(&second) {
            let meta = nix::sys::stat::fstat(fd.as_raw_fd()).unwrap();
            assert_eq!(meta.st_ino, inode);
        }
        close();
        assert!(peek().is_err(), "the message is gone after close");
    }
}
