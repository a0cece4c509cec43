//! What a tool writes on its stdout, read as a stream whose end is checked:
//! at the end of the bytes the tool's exit status must be success (a tool
//! that failed half way is an error, never a short stream). Used for
//! `sqfs2tar` on a user's squashfs file and for `docker save` / `podman
//! save` run by the rootless CLI. Dropped early, the tool is killed.

use std::io::{self, Read};
use std::process::{Child, ChildStdout, Command, Stdio};

/// The most bytes of a tool's stderr kept for an error message.
const MAX_TOOL_STDERR: u64 = 16 << 10;

/// A running tool's stdout.
pub struct ToolStream {
    child: Child,
    stdout: ChildStdout,
    stderr: Option<std::thread::JoinHandle<String>>,
    what: String,
}

impl ToolStream {
    /// Starts `command` (stdin empty, stdout and stderr piped); `what` names
    /// the tool and its input in messages (`sqfs2tar of /home/u/x.sqsh`);
    /// `install` says what to install when the tool is missing.
    pub fn start(mut command: Command, what: &str, install: &str) -> io::Result<ToolStream> {
        let program = command.get_program().to_string_lossy().into_owned();
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot run {program} (install {install}): {e}"),
                )
            })?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut err = child.stderr.take().expect("stderr is piped");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = (&mut err).take(MAX_TOOL_STDERR).read_to_string(&mut text);
            let _ = io::copy(&mut err, &mut io::sink());
            text
        });
        Ok(ToolStream {
            child,
            stdout,
            stderr: Some(stderr),
            what: what.to_string(),
        })
    }

    /// At the end of the stream: an error unless the tool succeeded.
    fn finish(&mut self) -> io::Result<()> {
        let status = self.child.wait()?;
        let stderr = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        if status.success() {
            return Ok(());
        }
        let said = stderr.trim().replace('\n', "; ");
        Err(io::Error::other(format!(
            "{} failed ({status}): {said}",
            self.what
        )))
    }
}

impl Read for ToolStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.stdout.read(buf)?;
        if n == 0 && !buf.is_empty() && self.stderr.is_some() {
            self.finish()?;
        }
        Ok(n)
    }
}

impl Drop for ToolStream {
    fn drop(&mut self) {
        if self.stderr.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_that_fails_after_its_output_is_an_error_at_the_end() {
        let mut ok = Command::new("sh");
        ok.args(["-c", "printf hi"]);
        let mut out = String::new();
        ToolStream::start(ok, "sh", "sh")
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, "hi");
        let mut bad = Command::new("sh");
        bad.args(["-c", "printf hi; echo broken >&2; exit 3"]);
        let e = ToolStream::start(bad, "save of x", "sh")
            .unwrap()
            .read_to_string(&mut out)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("save of x failed") && e.contains("broken"),
            "{e}"
        );
    }
}
