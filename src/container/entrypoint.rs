//! The image ENTRYPOINT.
//!
//! Two uses, two meanings:
//!
//! - the CLI (`berth run --entrypoint`) runs ENTRYPOINT with the command as
//!   its arguments, like `docker run` ([`command_with_entrypoint`]);
//! - the Slurm plugin (`--container-entrypoint`) follows pyxis: the
//!   ENTRYPOINT runs once per container, when the container is created, with
//!   a tiny shell as its arguments that stops itself ([`run_at_start`]); what
//!   the entrypoint changed in the file system stays for the tasks, and what
//!   it changed in its environment is applied to every task
//!   ([`EntrypointOutcome`]). The tasks themselves stay Slurm's own
//!   processes: exit codes, signals, stdio and PMIx are untouched.

use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::image::ImageConfig;

/// The arguments given to the ENTRYPOINT at container start: a shell that
/// stops itself, so that its environment can be read. An entrypoint that ends
/// with `exec "$@"` (the usual form) becomes this shell.
pub const STOP_COMMAND: [&str; 3] = ["/bin/sh", "-c", "kill -STOP $$; exit 0"];

/// How long the ENTRYPOINT may take before it runs its arguments.
pub const START_TIMEOUT: Duration = Duration::from_secs(90);

/// The largest entrypoint output kept for the log.
const LOG_LIMIT: u64 = 64 << 10;

/// Variables the stop shell sets itself; never taken as the entrypoint's.
const SHELL_VARIABLES: &[&str] = &["PWD", "OLDPWD", "SHLVL", "_"];

/// The ENTRYPOINT to run when the container is created (Slurm plugin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntrypointRun {
    /// The image's ENTRYPOINT.
    pub command: Vec<String>,
    /// The environment it starts with: what a task would get without it.
    pub env: Vec<(String, String)>,
}

/// What running the ENTRYPOINT at container start left for the tasks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntrypointOutcome {
    /// Variables the entrypoint set or changed, in its order.
    pub set: Vec<(String, String)>,
    /// Variables the entrypoint removed.
    pub unset: Vec<String>,
    /// Its standard output and error (the first 64 KiB).
    pub log: String,
}

/// Runs `run.command` followed by [`STOP_COMMAND`] in the current process's
/// root and working directory (the holder, inside the container, as the
/// user), waits until the stop shell has stopped, reads its environment,
/// and lets it exit. The entrypoint runs with `no_new_privs`, like every
/// other process of the container; processes it left in the background
/// (daemons included: the holder is their subreaper) are killed once its
/// environment is read, so nothing it started outlives the container's
/// creation.
///
/// Fails when the entrypoint exits before running its arguments, or takes
/// longer than [`START_TIMEOUT`]; the error carries the entrypoint's output.
pub fn run_at_start(run: &EntrypointRun, remap_root: bool) -> anyhow::Result<EntrypointOutcome> {
    run_with_timeout(run, remap_root, START_TIMEOUT)
}

fn run_with_timeout(
    run: &EntrypointRun,
    remap_root: bool,
    timeout: Duration,
) -> anyhow::Result<EntrypointOutcome> {
    let Some(program) = run.command.first() else {
        bail!("the image ENTRYPOINT is empty");
    };
    let log = log_file()?;
    let log_out = log
        .try_clone()
        .context("cannot duplicate the entrypoint log")?;
    let mut command = Command::new(program);
    command
        .args(&run.command[1..])
        .args(STOP_COMMAND)
        .env_clear()
        .envs(run.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::from(log_out))
        .stderr(Stdio::from(
            log.try_clone()
                .context("cannot duplicate the entrypoint log")?,
        ))
        .process_group(0);
    // The entrypoint dies with the holder: killed during setup (kill -9,
    // scancel), the holder must not leave it behind, stopped or running, in
    // a container nobody will ever join (its mounts and loop device with it).
    let holder = std::process::id() as libc::pid_t;
    // SAFETY: the closure makes raw syscalls only (prctl, getppid); the holder
    // is single-threaded.
    unsafe {
        command.pre_exec(move || die_with_parent(holder));
    }
    // SAFETY: the closure makes one raw syscall (prctl).
    unsafe {
        command.pre_exec(no_new_privs);
    }
    if remap_root {
        // SAFETY: the closure makes one raw syscall (seccomp); the holder is
        // single-threaded.
        unsafe {
            command.pre_exec(crate::container::seccomp::install_remap_root_filter);
        }
    }
    let shown = run.command.join(" ");
    // Orphans of the entrypoint (a daemon's double fork) become the holder's
    // children, so they can be found and killed below. Only in a
    // single-threaded caller (the holder): another thread's children (the
    // unit tests') are not the entrypoint's.
    let reaper = single_threaded();
    let before = children_of(holder);
    // SAFETY: prctl with integer arguments.
    if reaper && unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error())
            .context("cannot make the container helper a child subreaper");
    }
    let leftovers = |pid: Pid| {
        let _ = killpg(pid, Signal::SIGKILL);
        if reaper {
            kill_leftovers(holder, &before);
        }
    };
    let child = command
        .spawn()
        .with_context(|| format!("cannot start the image ENTRYPOINT '{shown}'"))?;
    let pid = Pid::from_raw(child.id() as i32);
    let stopped = wait_until_stopped(pid, timeout);
    let output = read_log(log);
    let failure = |reason: String| {
        let _ = killpg(pid, Signal::SIGKILL);
        let _ = waitpid(pid, None);
        leftovers(pid);
        anyhow::anyhow!(
            "the image ENTRYPOINT '{shown}' {reason} (run without it with \
             --no-container-entrypoint){}",
            if output.trim().is_empty() {
                "; it printed nothing".to_string()
            } else {
                format!("; its output:\n{}", output.trim_end())
            }
        )
    };
    match stopped {
        Ok(None) => {}
        Ok(Some(reason)) => return Err(failure(reason)),
        Err(err) => return Err(failure(format!("could not be waited for: {err}"))),
    }
    let environ = std::fs::read(format!("/proc/{pid}/environ"))
        .map_err(|err| failure(format!("stopped, but its environment is unreadable: {err}")))?;
    let _ = kill(pid, Signal::SIGCONT);
    let _ = waitpid(pid, None);
    leftovers(pid);
    let captured = parse_environ(&environ);
    let (set, unset) = env_changes(&run.env, &captured);
    Ok(EntrypointOutcome {
        set,
        unset,
        log: output,
    })
}

/// Sets `no_new_privs`: no set-id bit or file capability of the image gives
/// the entrypoint more than the user has. Runs between fork and exec.
fn no_new_privs() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments; no memory is passed.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process has one thread (`Threads:` of `/proc/self/status`).
fn single_threaded() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["Threads:", "1"])
    })
}

/// The pids whose parent is `parent` (from `/proc/PID/stat`).
fn children_of(parent: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| parent_in_stat(&stat))
                == Some(parent)
        })
        .collect()
}

/// The parent pid in the text of `/proc/PID/stat` (the field after the
/// state, which follows the command name's closing parenthesis).
fn parent_in_stat(stat: &str) -> Option<libc::pid_t> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Kills and reaps every child of `holder` but those in `keep`, until none
/// is left: what the entrypoint started, and their orphans, which the
/// subreaper receives as their parents die.
fn kill_leftovers(holder: libc::pid_t, keep: &[libc::pid_t]) {
    for _ in 0..1000 {
        let left: Vec<_> = children_of(holder)
            .into_iter()
            .filter(|pid| !keep.contains(pid))
            .collect();
        if left.is_empty() {
            return;
        }
        for pid in &left {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        for pid in &left {
            let _ = waitpid(Pid::from_raw(*pid), None);
        }
    }
}

/// Asks for SIGKILL when the parent `parent` exits; fails if it is already
/// gone. Runs between fork and exec.
fn die_with_parent(parent: libc::pid_t) -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments; no memory is passed.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: getppid has no arguments and cannot fail.
    if unsafe { libc::getppid() } != parent {
        return Err(std::io::Error::other("the container helper exited"));
    }
    Ok(())
}

/// Waits for `pid` to stop (`None`), or says why it will not.
fn wait_until_stopped(pid: Pid, timeout: Duration) -> anyhow::Result<Option<String>> {
    let deadline = Instant::now() + timeout;
    loop {
        match waitpid(pid, Some(WaitPidFlag::WUNTRACED | WaitPidFlag::WNOHANG))? {
            WaitStatus::Stopped(..) => return Ok(None),
            WaitStatus::Exited(_, 0) => {
                return Ok(Some(
                    "exited without running its arguments (it must end with exec \"$@\")".into(),
                ))
            }
            WaitStatus::Exited(_, code) => {
                return Ok(Some(format!("failed with exit code {code}")))
            }
            WaitStatus::Signaled(_, signal, _) => {
                return Ok(Some(format!("was killed by signal {signal}")))
            }
            _ if Instant::now() > deadline => {
                return Ok(Some(format!(
                    "did not run its arguments within {} s (it must end with exec \"$@\")",
                    timeout.as_secs()
                )))
            }
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// An anonymous in-memory file for the entrypoint's output.
fn log_file() -> anyhow::Result<std::fs::File> {
    // SAFETY: memfd_create with a valid C string and flags; the returned
    // descriptor is new and owned by nobody else.
    let fd = unsafe { libc::memfd_create(c"berth-entrypoint-log".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error())
            .context("cannot create an in-memory file for the entrypoint log");
    }
    // SAFETY: `fd` was just created and is owned here only.
    Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// The first [`LOG_LIMIT`] bytes of the log, as text.
fn read_log(mut log: std::fs::File) -> String {
    let mut bytes = Vec::new();
    if log.seek(SeekFrom::Start(0)).is_ok() {
        let _ = (&mut log).take(LOG_LIMIT).read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Splits `/proc/PID/environ` (NUL-separated `NAME=VALUE`) into pairs.
pub fn parse_environ(bytes: &[u8]) -> Vec<(String, String)> {
    bytes
        .split(|b| *b == 0)
        .filter(|entry| !entry.is_empty())
        .filter_map(|entry| {
            let text = String::from_utf8_lossy(entry);
            let (name, value) = text.split_once('=')?;
            Some((name.to_string(), value.to_string()))
        })
        .collect()
}

/// What changed from `before` to `after`: variables set or changed (in the
/// order of `after`), and variables removed; the stop shell's own variables
/// ([`SHELL_VARIABLES`]) are left out.
pub fn env_changes(
    before: &[(String, String)],
    after: &[(String, String)],
) -> (Vec<(String, String)>, Vec<String>) {
    let own = |name: &str| SHELL_VARIABLES.contains(&name);
    let set = after
        .iter()
        .filter(|(name, value)| !own(name) && !before.iter().any(|(n, v)| n == name && v == value))
        .cloned()
        .collect();
    let unset = before
        .iter()
        .filter(|(name, _)| !own(name) && !after.iter().any(|(n, _)| n == name))
        .map(|(name, _)| name.clone())
        .collect();
    (set, unset)
}

/// ENTRYPOINT followed by `argv`; with an empty `argv`, ENTRYPOINT followed by
/// the image's CMD. Without an ENTRYPOINT, `argv` as is (or CMD when `argv`
/// is empty), so the result is what the task runs.
pub fn command_with_entrypoint(config: &ImageConfig, argv: &[String]) -> Vec<String> {
    let entrypoint = config.entrypoint.as_deref().unwrap_or_default();
    let rest = if argv.is_empty() {
        config.cmd.as_deref().unwrap_or_default()
    } else {
        argv
    };
    entrypoint.iter().chain(rest).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn config(entrypoint: Option<&[&str]>, cmd: Option<&[&str]>) -> ImageConfig {
        ImageConfig {
            entrypoint: entrypoint.map(strings),
            cmd: cmd.map(strings),
            ..ImageConfig::default()
        }
    }

    #[test]
    fn entrypoint_then_arguments() {
        let config = config(Some(&["/init.sh", "-v"]), Some(&["bash"]));
        assert_eq!(
            command_with_entrypoint(&config, &strings(&["python", "train.py"])),
            strings(&["/init.sh", "-v", "python", "train.py"])
        );
    }

    #[test]
    fn entrypoint_then_cmd_without_arguments() {
        let config = config(Some(&["/init.sh"]), Some(&["bash", "-l"]));
        assert_eq!(
            command_with_entrypoint(&config, &[]),
            strings(&["/init.sh", "bash", "-l"])
        );
    }

    /// Runs `script` as a `/bin/sh -c` entrypoint on the host.
    fn run_script(script: &str, timeout: Duration) -> anyhow::Result<EntrypointOutcome> {
        let run = EntrypointRun {
            command: strings(&["/bin/sh", "-c", script, "entrypoint"]),
            env: vec![
                ("PATH".to_string(), "/usr/bin:/bin".to_string()),
                ("KEEP".to_string(), "1".to_string()),
                ("DROP".to_string(), "1".to_string()),
            ],
        };
        run_with_timeout(&run, false, timeout)
    }

    /// The entrypoint runs with no_new_privs, and a job it left in the
    /// background is killed once the container is made.
    #[test]
    fn entrypoint_has_no_new_privs_and_leaves_nothing_running() {
        let mark = format!("{}", 4_000_000 + std::process::id());
        let outcome = run_script(
            &format!("grep NoNewPrivs /proc/self/status; sleep {mark} & exec \"$@\""),
            START_TIMEOUT,
        )
        .unwrap();
        assert!(outcome.log.contains("NoNewPrivs:\t1"), "{}", outcome.log);
        let running = || {
            std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
                std::fs::read(e.path().join("cmdline"))
                    .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == mark.as_bytes()))
            })
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!running(), "the entrypoint's background job outlived it");
    }

    #[test]
    fn stat_parent_is_read_after_the_name() {
        assert_eq!(parent_in_stat("42 (a) b) S 7 42 42 0"), Some(7));
        assert_eq!(parent_in_stat("garbage"), None);
    }

    #[test]
    fn entrypoint_changes_and_output_are_kept() {
        let outcome = run_script(
            "echo to-stdout; echo to-stderr >&2; export ADDED=yes KEEP=2; unset DROP; exec \"$@\"",
            START_TIMEOUT,
        )
        .unwrap();
        let mut set = outcome.set.clone();
        set.sort();
        assert_eq!(
            set,
            vec![
                ("ADDED".to_string(), "yes".to_string()),
                ("KEEP".to_string(), "2".to_string()),
            ]
        );
        assert_eq!(outcome.unset, vec!["DROP".to_string()]);
        assert!(outcome.log.contains("to-stdout\n"), "{}", outcome.log);
        assert!(outcome.log.contains("to-stderr\n"), "{}", outcome.log);
    }

    #[test]
    fn entrypoint_failures_name_the_reason_and_show_the_output() {
        let err = run_script("echo broken >&2; exit 3", START_TIMEOUT)
            .unwrap_err()
            .to_string();
        assert!(err.contains("failed with exit code 3"), "{err}");
        assert!(err.contains("its output:\nbroken"), "{err}");
        assert!(err.contains("--no-container-entrypoint"), "{err}");
        let err = run_script("true", START_TIMEOUT).unwrap_err().to_string();
        assert!(
            err.contains("exited without running its arguments"),
            "{err}"
        );
        assert!(err.contains("it printed nothing"), "{err}");
        // Runs its arguments without exec: the stop shell is a grandchild.
        let err = run_script("\"$@\"; sleep 30", Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("did not run its arguments within 1 s"),
            "{err}"
        );
    }

    #[test]
    fn environ_is_split_into_pairs() {
        assert_eq!(
            parse_environ(b"A=1\0B=x=y\0\0broken\0C=\0"),
            vec![
                ("A".to_string(), "1".to_string()),
                ("B".to_string(), "x=y".to_string()),
                ("C".to_string(), String::new()),
            ]
        );
    }

    #[test]
    fn changes_leave_out_the_shell_and_what_stayed() {
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let before = pairs(&[
            ("PATH", "/bin"),
            ("KEEP", "1"),
            ("GONE", "x"),
            ("PWD", "/a"),
        ]);
        let after = pairs(&[
            ("PATH", "/opt/bin:/bin"),
            ("KEEP", "1"),
            ("NEW", "yes"),
            ("PWD", "/b"),
            ("SHLVL", "1"),
        ]);
        let (set, unset) = env_changes(&before, &after);
        assert_eq!(set, pairs(&[("PATH", "/opt/bin:/bin"), ("NEW", "yes")]));
        assert_eq!(unset, vec!["GONE".to_string()]);
    }

    #[test]
    fn no_entrypoint_keeps_the_command() {
        let config = config(None, Some(&["bash"]));
        assert_eq!(
            command_with_entrypoint(&config, &strings(&["id"])),
            strings(&["id"])
        );
        assert_eq!(command_with_entrypoint(&config, &[]), strings(&["bash"]));
        assert!(command_with_entrypoint(&ImageConfig::default(), &[]).is_empty());
    }
}
