//! Running the pull helper from slurmstepd while its progress reaches the
//! user: the helper prints plain progress lines on stderr (`--progress
//! lines`); summary lines are passed on to srun's output, one per node at
//! most every [`FORWARD_INTERVAL`], and the final "pulled" line always.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ExitStatus};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

/// How often a node tells the user how its pull is going.
pub const FORWARD_INTERVAL: Duration = Duration::from_secs(10);

/// What the helper printed and how it ended.
#[derive(Debug)]
pub struct PullOutput {
    /// The helper's exit status.
    pub status: ExitStatus,
    /// Its standard output (the JSON answer).
    pub stdout: Vec<u8>,
    /// Its standard error, every line.
    pub stderr: String,
}

/// Waits for `child` (stdout and stderr piped) while forwarding its progress
/// lines through `show`, prefixed with `label` (e.g. `node3: IMAGE`). An
/// interrupt ([`crate::interrupt`]) kills the child and ends the wait with an
/// [`std::io::ErrorKind::Interrupted`] error.
pub fn wait_forwarding(
    mut child: Child,
    label: &str,
    mut show: impl FnMut(&str),
) -> std::io::Result<PullOutput> {
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let stdout_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        stdout.read_to_end(&mut buf).map(|_| buf)
    });
    let stderr = child.stderr.take().expect("stderr is piped");
    let (lines, received) = std::sync::mpsc::channel();
    let stderr_reader = std::thread::spawn(move || -> std::io::Result<()> {
        for line in BufReader::new(stderr).split(b'\n') {
            if lines.send(line?).is_err() {
                break;
            }
        }
        Ok(())
    });
    let mut forwarder = Forwarder::new(FORWARD_INTERVAL);
    let mut all = String::new();
    loop {
        if let Some(reason) = crate::interrupt::requested() {
            // The readers end when the killed child's pipes close.
            let _ = crate::interrupt::wait_child(&mut child);
            return Err(crate::interrupt::interrupted_error(&reason));
        }
        let line = match received.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let line = String::from_utf8_lossy(&line).into_owned();
        if let Some(text) = forwarder.offer(&line, Instant::now()) {
            show(&format!("{label}: {text}"));
        }
        all.push_str(&line);
        all.push('\n');
    }
    let status = crate::interrupt::wait_child(&mut child)?;
    stderr_reader
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the stderr reader panicked")))?;
    let stdout = stdout_reader
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the stdout reader panicked")))?;
    Ok(PullOutput {
        status,
        stdout,
        stderr: all,
    })
}

/// Decides which helper lines the user sees.
#[derive(Debug)]
struct Forwarder {
    interval: Duration,
    last: Option<Instant>,
}

impl Forwarder {
    fn new(interval: Duration) -> Forwarder {
        Forwarder {
            interval,
            last: None,
        }
    }

    /// The text to show for `line` at `now`, if any: the final "pulled" line
    /// always; a progress summary once the interval since the last one passed.
    fn offer(&mut self, line: &str, now: Instant) -> Option<String> {
        let text = line.strip_prefix("berth: ")?;
        if text.starts_with("pulled ") {
            return Some(text.to_string());
        }
        let progress = text.starts_with("fetched ") || text.starts_with("all ");
        if !progress {
            return None;
        }
        match self.last {
            Some(last) if now.duration_since(last) < self.interval => None,
            _ => {
                self.last = Some(now);
                Some(text.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn progress_is_forwarded_at_most_once_per_interval() {
        let mut f = Forwarder::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(f.offer("berth: resolving x", at(0)), None);
        assert_eq!(
            f.offer(
                "berth: fetched 1 of 9 MB (11%), 0 of 2 layers, 5.0 s",
                at(5)
            )
            .as_deref(),
            Some("fetched 1 of 9 MB (11%), 0 of 2 layers, 5.0 s")
        );
        assert_eq!(f.offer("berth: fetched 2 of 9 MB (22%)", at(10)), None);
        assert!(f
            .offer(
                "berth: all 2 layers fetched; converting layer 1 of 2",
                at(15)
            )
            .is_some());
        assert!(f.offer("berth: pulled 2 layers (9 MB)", at(16)).is_some());
        assert_eq!(f.offer("berth: warning: x", at(40)), None);
    }

    #[test]
    fn a_child_is_waited_for_with_everything_it_printed() {
        let child = Command::new("sh")
            .args([
                "-c",
                "echo 'berth: fetched 1 of 2 MB'; echo other >&2; echo '{\"a\":1}'; \
                 echo 'berth: pulled 1 layer' >&2; exit 3",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut shown = Vec::new();
        let out = wait_forwarding(child, "node1: img", |s| shown.push(s.to_string())).unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"berth: fetched 1 of 2 MB\n{\"a\":1}\n");
        assert_eq!(out.stderr, "other\nberth: pulled 1 layer\n");
        assert_eq!(shown, ["node1: img: pulled 1 layer"]);
    }
}
