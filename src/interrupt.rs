//! Giving up on a step's setup when the step ends early.
//!
//! slurmstepd runs a step's container setup (pull, fan-out wait, mount)
//! before the step's tasks exist, and Slurm only signals tasks: a `scancel`
//! during a long pull would otherwise wait for the pull to end. A watcher
//! (`step::cancel_watch`) calls [`request`] when the step or its job
//! ended; every wait for a helper process ([`wait_child`]) then kills its
//! child and fails with the reason. The CLI never requests an interrupt.

use std::process::{Child, ExitStatus};
use std::sync::Mutex;
use std::time::Duration;

/// Why the setup should stop, once requested.
static REQUESTED: Request = Request::new();

/// A reason to stop, set once.
struct Request(Mutex<Option<String>>);

impl Request {
    const fn new() -> Request {
        Request(Mutex::new(None))
    }

    fn set(&self, reason: &str) {
        let mut requested = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if requested.is_none() {
            *requested = Some(reason.to_string());
        }
    }

    fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn clear(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// How often a wait for a helper looks for an interrupt.
const CHECK_EVERY: Duration = Duration::from_millis(20);

/// Asks every current and later helper wait to stop, for `reason`
/// (e.g. "job 12 was cancelled"); the first reason stays.
pub fn request(reason: &str) {
    REQUESTED.set(reason);
}

/// The reason an interrupt was requested, if it was.
pub fn requested() -> Option<String> {
    REQUESTED.get()
}

/// Forgets a requested interrupt (a new step in the same process, tests).
pub fn reset() {
    REQUESTED.clear();
}

/// The error of a wait that was interrupted.
pub fn interrupted_error(reason: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::Interrupted, reason.to_string())
}

/// Waits for `child` to exit. When an interrupt is requested meanwhile,
/// kills it (taking root for a child of another user) and returns an
/// [`std::io::ErrorKind::Interrupted`] error carrying the reason.
pub fn wait_child(child: &mut Child) -> std::io::Result<ExitStatus> {
    wait_child_unless(child, requested)
}

/// [`wait_child`] with the interrupt asked of `stop`.
fn wait_child_unless(
    child: &mut Child,
    stop: impl Fn() -> Option<String>,
) -> std::io::Result<ExitStatus> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if let Some(reason) = stop() {
            let _ = crate::privilege::with_root(|| child.kill());
            let _ = child.wait();
            return Err(interrupted_error(&reason));
        }
        std::thread::sleep(CHECK_EVERY);
    }
}

/// Runs `command` to its end like [`std::process::Command::output`]
/// (stdout and stderr collected), unless an interrupt kills it.
pub fn output(command: &mut std::process::Command) -> std::io::Result<std::process::Output> {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let read_all = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = read_all(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = read_all(child.stderr.take().map(|p| Box::new(p) as _));
    let status = wait_child(&mut child)?;
    Ok(std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn an_interrupt_kills_the_waited_child() {
        let flag: Arc<Mutex<Option<String>>> = Arc::default();
        let stop = {
            let flag = Arc::clone(&flag);
            move || flag.lock().unwrap().clone()
        };
        let mut quick = Command::new("true").spawn().unwrap();
        assert!(wait_child_unless(&mut quick, &stop).unwrap().success());
        let mut slow = Command::new("sleep").arg("30").spawn().unwrap();
        let started = Instant::now();
        let waiter = std::thread::spawn(move || {
            let result = wait_child_unless(&mut slow, stop);
            (result, slow)
        });
        std::thread::sleep(Duration::from_millis(100));
        *flag.lock().unwrap() = Some("job 7 was cancelled".into());
        let (result, mut slow) = waiter.join().unwrap();
        let error = result.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::Interrupted);
        assert_eq!(error.to_string(), "job 7 was cancelled");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(slow.try_wait().unwrap().is_some(), "the child is gone");
    }

    #[test]
    fn the_first_reason_stays_until_reset() {
        // A local request: the process-wide one would reach other tests' waits.
        let request = Request::new();
        assert_eq!(request.get(), None);
        request.set("job 7 was cancelled");
        request.set("a later reason");
        assert_eq!(request.get().as_deref(), Some("job 7 was cancelled"));
        request.clear();
        assert_eq!(request.get(), None);
    }
}
