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
//! copy of every descriptor in the peeking process) and uses its own copies.
//! slurmstepd's `exit` closes the pair, which lets the files go.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The most descriptors one step sends.
const MAX_FDS: usize = 16;

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

/// Sends `fds` (the clone's own) to slurmstepd's socket pair.
pub fn send(fds: &[RawFd]) -> Result<(), String> {
    let (tx, _) = CHANNEL
        .get()
        .ok_or("contain_spank: no socket pair was made in init")?;
    if fds.is_empty() || fds.len() > MAX_FDS {
        return Err(format!(
            "contain_spank: cannot send {} descriptors",
            fds.len()
        ));
    }
    let bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut data = [1u8];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; the zeroed fields are valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer has CMSG_SPACE(bytes) bytes, so the first
    // header and its data lie inside it.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(bytes as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(header), bytes);
    }
    // SAFETY: msg points at buffers that live until sendmsg returns.
    if unsafe { libc::sendmsg(tx.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) } < 0 {
        return Err(format!(
            "contain_spank: cannot send the container's descriptors: {}",
            std::io::Error::last_os_error()
        ));
    }
    SENT.store(true, Ordering::SeqCst);
    Ok(())
}

/// This process's own copies of the sent descriptors, in the order sent
/// (close-on-exec). Leaves the message for the next task.
pub fn peek() -> Result<Vec<OwnedFd>, String> {
    let (_, rx) = CHANNEL
        .get()
        .ok_or("contain_spank: no socket pair was made in init")?;
    let bytes = MAX_FDS * std::mem::size_of::<RawFd>();
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut data = [0u8];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; the zeroed fields are valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let flags = libc::MSG_PEEK | libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC;
    // SAFETY: msg points at buffers that live until recvmsg returns.
    if unsafe { libc::recvmsg(rx.as_raw_fd(), &mut msg, flags) } < 0 {
        return Err(format!(
            "contain_spank: no container descriptors from user_init: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled the control buffer; the CMSG macros walk
    // only the headers inside msg_controllen.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let len = (*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(header).cast::<RawFd>();
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    // SAFETY: the kernel installed these descriptors in
                    // this process for this call; nothing else owns them.
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err("contain_spank: the container's descriptors were cut short".into());
    }
    Ok(fds)
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
        send(&[ns.as_raw_fd()]).unwrap();
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
