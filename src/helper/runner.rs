//! Starting a helper process and waiting for it, the one way: as whom it
//! runs ([`RunAs`]), what goes to its stdin, how long it may take, how much
//! of its output is kept, and which of its progress lines (stderr, plain
//! `berth: ...` lines) reach the user while it runs: summary lines at most
//! every [`FORWARD_INTERVAL`] per helper, and the final "pulled" line always.
//! An interrupt ([`crate::interrupt`]: the job was cancelled) kills the
//! helper and ends the wait with an [`std::io::ErrorKind::Interrupted`] error.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

/// How often a node tells the user how its pull is going.
pub const FORWARD_INTERVAL: Duration = Duration::from_secs(10);

/// The most bytes of stderr kept (lines past it are still forwarded).
const MAX_STDERR_BYTES: usize = 1 << 20;

/// Who the helper runs as. From slurmstepd (real uid 0, effective uid the
/// job's user) and from root alike; a process without root runs it as itself.
#[derive(Debug, Clone)]
pub enum RunAs {
    /// This user, with exactly these groups, `no_new_privs`
    /// ([`crate::privilege::run_as_user`]): the job's user, the pull user.
    User {
        /// uid.
        uid: u32,
        /// Primary gid.
        gid: u32,
        /// Supplementary groups (none when empty).
        groups: Vec<u32>,
    },
    /// Full root (real, effective and saved ids 0, no groups).
    FullRoot,
    /// Whoever runs this process (no switch).
    Caller,
}

/// Where forwarded progress lines go: a label (`NODE: IMAGE`) and a sink.
pub type Forward<'a> = (&'a str, &'a dyn Fn(&str));

/// How to run one helper.
pub struct Options<'a> {
    /// Bytes for its stdin (stdin is empty when this is).
    pub input: &'a [u8],
    /// Longest wait; then the helper is killed and the wait fails with
    /// [`std::io::ErrorKind::TimedOut`]. `None`: no limit.
    pub limit: Option<Duration>,
    /// The most bytes of stdout kept; the rest is read and dropped.
    pub max_stdout: u64,
    /// Forwards progress lines while it runs: a label (`NODE: IMAGE`) and
    /// where to show them.
    pub forward: Option<Forward<'a>>,
    /// Take root in this process to start and kill the helper (default).
    /// `false` for a thread that must not change the process's effective
    /// ids (the cancel watcher): the limit is then enforced by the kernel,
    /// with an `alarm` set in the helper before it execs.
    pub take_root: bool,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Options {
            input: &[],
            limit: None,
            max_stdout: 1 << 20,
            forward: None,
            take_root: true,
        }
    }
}

/// What the helper printed and how it ended.
#[derive(Debug)]
pub struct Finished {
    /// The helper's exit status.
    pub status: ExitStatus,
    /// Its standard output (the reply), up to [`Options::max_stdout`].
    pub stdout: Vec<u8>,
    /// Its standard error, every line (up to 1 MiB).
    pub stderr: String,
}

/// Starts `command` as `run_as` (stdin, stdout and stderr are set here) and
/// waits for it as `options` say. Errors: it could not be started (the
/// caller says which helper), it ran past the limit, or it was interrupted.
pub fn run(command: &mut Command, run_as: RunAs, options: Options) -> std::io::Result<Finished> {
    command
        .stdin(if options.input.is_empty() {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match run_as {
        RunAs::User { uid, gid, groups } => {
            crate::privilege::run_as_user(command, uid, gid, groups)
        }
        RunAs::FullRoot => crate::privilege::run_as_full_root(command),
        RunAs::Caller => {}
    }
    if let Some(limit) = options.limit.filter(|_| !options.take_root) {
        let seconds = limit.as_secs().max(1) as libc::c_uint;
        // SAFETY: alarm(2) is async-signal-safe; the alarm survives execve,
        // and SIGALRM ends a helper that installs no handler for it.
        unsafe {
            command.pre_exec(move || {
                libc::alarm(seconds);
                Ok(())
            });
        }
    }
    let mut child = if options.take_root {
        crate::privilege::with_root(|| command.spawn())?
    } else {
        command.spawn()?
    };
    let stdin = child.stdin.take();
    let input = options.input;
    std::thread::scope(|s| {
        s.spawn(move || {
            if let Some(mut pipe) = stdin {
                // A helper that died early closes the pipe: its stderr says why.
                let _ = pipe.write_all(input);
            }
        });
        wait(child, &options)
    })
}

/// Waits for `child` (stdout and stderr piped), forwarding its progress
/// lines, within the limit.
fn wait(mut child: Child, options: &Options) -> std::io::Result<Finished> {
    let stdout = child.stdout.take().expect("stdout is piped");
    let max_stdout = options.max_stdout;
    let stdout_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut pipe = stdout;
        pipe.by_ref().take(max_stdout).read_to_end(&mut buf)?;
        // Drain the rest so the helper never blocks on a full pipe.
        std::io::copy(&mut pipe, &mut std::io::sink())?;
        Ok::<_, std::io::Error>(buf)
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
    let (label, show): (&str, &dyn Fn(&str)) = options.forward.unwrap_or(("", &|_: &str| {}));
    let mut forwarder = Forwarder::new(FORWARD_INTERVAL);
    let mut all = String::new();
    let started = Instant::now();
    // Without root the helper's alarm ends it first; the kill is a fallback.
    let limit = options.limit.map(|l| match options.take_root {
        true => l,
        false => l + Duration::from_secs(2),
    });
    loop {
        if let Some(reason) = crate::interrupt::requested() {
            // The readers end when the killed child's pipes close.
            let _ = crate::interrupt::wait_child(&mut child);
            return Err(crate::interrupt::interrupted_error(&reason));
        }
        if let Some(limit) = limit.filter(|l| started.elapsed() > *l) {
            kill(&mut child, options.take_root);
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer in {} s", limit.as_secs()),
            ));
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
        if all.len() < MAX_STDERR_BYTES {
            all.push_str(&line);
            all.push('\n');
        }
    }
    let status = loop {
        // stderr closed: the helper is (about to be) gone, or it closed
        // stderr and runs on; the limit and interrupts still apply.
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if crate::interrupt::requested().is_some() || limit.is_some_and(|l| started.elapsed() > l) {
            kill(&mut child, options.take_root);
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the helper did not end after closing its output",
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    stderr_reader
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the stderr reader panicked")))?;
    let stdout = stdout_reader
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the stdout reader panicked")))?;
    Ok(Finished {
        status,
        stdout,
        stderr: all,
    })
}
/// Kills and reaps `child` (taking root for it when allowed; else the
/// helper's alarm ends it).
fn kill(child: &mut Child, take_root: bool) {
    if take_root {
        let _ = crate::privilege::with_root(|| child.kill());
    } else {
        let _ = child.kill();
    }
    let _ = child.wait();
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
        let shown = std::cell::RefCell::new(Vec::new());
        let forward = |s: &str| shown.borrow_mut().push(s.to_string());
        let mut command = Command::new("sh");
        command.args([
            "-c",
            "read line; echo \"$line\"; echo 'berth: fetched 1 of 2 MB'; echo other >&2; \
             echo '{\"a\":1}'; echo 'berth: pulled 1 layer' >&2; exit 3",
        ]);
        let out = run(
            &mut command,
            RunAs::Caller,
            Options {
                input: b"request\n",
                forward: Some(("node1: img", &forward)),
                ..Options::default()
            },
        )
        .unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(
            out.stdout,
            b"request\nberth: fetched 1 of 2 MB\n{\"a\":1}\n"
        );
        assert_eq!(out.stderr, "other\nberth: pulled 1 layer\n");
        assert_eq!(shown.into_inner(), ["node1: img: pulled 1 layer"]);
    }

    #[test]
    fn a_helper_past_its_limit_is_killed_and_its_output_is_capped() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo 0123456789; exec sleep 30"]);
        let started = Instant::now();
        let e = run(
            &mut command,
            RunAs::Caller,
            Options {
                limit: Some(Duration::from_millis(300)),
                ..Options::default()
            },
        )
        .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let mut command = Command::new("sh");
        command.args(["-c", "echo 0123456789"]);
        let options = Options {
            max_stdout: 4,
            ..Options::default()
        };
        let out = run(&mut command, RunAs::Caller, options).unwrap();
        assert_eq!(out.stdout, b"0123");
        assert!(out.status.success());
    }

    #[test]
    fn without_root_the_kernel_ends_a_helper_past_its_limit() {
        use std::os::unix::process::ExitStatusExt;
        // The alarm set before exec ends it (the runner's own kill would
        // come 2 s later).
        let mut command = Command::new("sh");
        command.args(["-c", "exec sleep 30"]);
        let started = Instant::now();
        let result = run(
            &mut command,
            RunAs::Caller,
            Options {
                limit: Some(Duration::from_secs(1)),
                take_root: false,
                ..Options::default()
            },
        );
        assert_eq!(result.unwrap().status.signal(), Some(libc::SIGALRM));
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
