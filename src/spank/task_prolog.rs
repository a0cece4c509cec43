//! slurmstepd side: the site's `TaskProlog` (slurm.conf) for tasks that run
//! in a container.
//!
//! Slurm 22.05 runs the TaskProlog in each task process after the SPANK
//! `task_init` callbacks, just before it execs the task's command: for a
//! container task, after berth has moved the task into the image, where the
//! site's script does not exist (and where its interpreter and tools may be
//! missing). So berth runs it itself, on the host and as the user, in
//! `task_init` before the task joins the container, exactly as Slurm would
//! (same environment plus `SLURM_SCRIPT_CONTEXT=prolog_task`, stdout and
//! stderr read together, `export`/`unset`/`print` lines applied), and binds
//! a program that only exits 0 at the TaskProlog's path inside the container,
//! so that Slurm's own run there is a no-op. A TaskProlog that fails fails
//! the task with its output; the node is never drained. The TaskEpilog needs
//! nothing: slurmstepd runs it on the host after the task.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};

use super::handle::Spank;

/// One instruction of the TaskProlog's output, as Slurm reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `export NAME=value`: set in the task's environment.
    Export(String, String),
    /// `unset NAME`: removed from the task's environment.
    Unset(String),
    /// `print TEXT`: written to the task's standard output.
    Print(String),
}

/// A TaskProlog that failed: what to tell the user, and the exit status the
/// task ends with (the script's, as Slurm does; 1 when it was killed).
#[derive(Debug)]
pub struct Failure {
    /// The message, with the script's output.
    pub message: String,
    /// The task's exit status.
    pub status: i32,
}

impl Failure {
    fn setup(prolog: &Path, what: impl std::fmt::Display) -> Failure {
        Failure {
            message: format!("TaskProlog {}: {what}", prolog.display()),
            status: 1,
        }
    }
}

/// Runs the TaskProlog on the host as the task's user (the task has its ids
/// by now) with the task's environment, as Slurm does; returns what its
/// output asks for. A failure carries the script's output.
pub fn run_on_host(spank: &Spank, prolog: &Path) -> Result<Vec<Action>, Failure> {
    let env = spank
        .job_env()
        .map_err(|e| Failure::setup(prolog, format!("cannot read the task's environment: {e}")))?;
    let (mut reader, writer) =
        std::io::pipe().map_err(|e| Failure::setup(prolog, format!("cannot make a pipe: {e}")))?;
    let writer2 = writer.try_clone().map_err(|e| Failure::setup(prolog, e))?;
    let mut command = Command::new(prolog);
    command
        .env_clear()
        .envs(env.iter().filter_map(|e| e.split_once('=')))
        .env("SLURM_SCRIPT_CONTEXT", "prolog_task")
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(writer2)
        .process_group(0);
    let mut child = command
        .spawn()
        .map_err(|e| Failure::setup(prolog, format!("cannot be run: {e}")))?;
    drop(command); // closes our copies of the pipe's write end
    let mut output = Vec::new();
    let _ = reader.read_to_end(&mut output);
    let status = child.wait().map_err(|e| Failure::setup(prolog, e))?;
    let output = String::from_utf8_lossy(&output).into_owned();
    if let Some(signal) = status.signal() {
        return Err(Failure::setup(
            prolog,
            format!("did not exit normally (signal {signal}): {}", output.trim()),
        ));
    }
    if let Some(code) = status.code().filter(|&c| c != 0) {
        return Err(Failure {
            message: format!(
                "TaskProlog {} failed with exit status {code}: {}",
                prolog.display(),
                output.trim()
            ),
            status: code,
        });
    }
    Ok(parse_output(&output))
}

/// Applies the TaskProlog's instructions to the task (in their order), after
/// the container's own environment: the prolog has the last word, as it has
/// for a task without a container.
pub fn apply(spank: &Spank, actions: &[Action]) -> Result<(), String> {
    let mut stdout = std::io::stdout().lock();
    for action in actions {
        match action {
            Action::Export(name, value) => spank
                .setenv(name, value)
                .map_err(|e| format!("TaskProlog: export {name}: {e}"))?,
            Action::Unset(name) => spank
                .unsetenv(name)
                .map_err(|e| format!("TaskProlog: unset {name}: {e}"))?,
            Action::Print(text) => {
                let _ = writeln!(stdout, "{text}");
            }
        }
    }
    let _ = stdout.flush();
    Ok(())
}

/// Reads a TaskProlog's output the way Slurm does: `export NAME=value`,
/// `unset NAME` and `print TEXT` lines; anything else is ignored.
pub fn parse_output(text: &str) -> Vec<Action> {
    let mut actions = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("print ") {
            actions.push(Action::Print(rest.trim_start().to_string()));
        } else if let Some(rest) = line.strip_prefix("export ") {
            if let Some((name, value)) = rest.trim_start().split_once('=') {
                let name = name.trim_end();
                if !name.is_empty() {
                    actions.push(Action::Export(name.to_string(), value.to_string()));
                }
            }
        } else if let Some(rest) = line.strip_prefix("unset ") {
            let name = rest.trim();
            if !name.is_empty() {
                actions.push(Action::Unset(name.to_string()));
            }
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_read_as_slurm_reads_it() {
        let out = "export  A=1\nexport B =x=y\nunset C \nprint   hello world\n\
                   exported D=no\nexport =nothing\nsome noise\nexport E=";
        assert_eq!(
            parse_output(out),
            vec![
                Action::Export("A".into(), "1".into()),
                Action::Export("B".into(), "x=y".into()),
                Action::Unset("C".into()),
                Action::Print("hello world".into()),
                Action::Export("E".into(), String::new()),
            ]
        );
    }
}
