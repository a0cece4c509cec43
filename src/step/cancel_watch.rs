//! Stopping a step's container setup when the step or its job has ended.
//!
//! Slurm signals a step's processes once its tasks run. Before that, while
//! slurmstepd pulls an image in `user_init`, a `scancel`, a time limit or an
//! interrupted srun reach berth's helpers only where proctrack/cgroup kills
//! the step's cgroup; with proctrack/linuxproc or pgid the pull would run to
//! its end while the job hangs in COMPLETING. This watcher asks slurmctld
//! about the job while the setup runs (`scontrol show job`, first after one
//! interval, so a cached image costs no question) and, once the job or the
//! step is over, interrupts the setup ([`crate::interrupt`]): the helper is
//! killed, its temp files are swept by the next pull, the node stays up.

use std::process::Command;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::stop_signal::StopSignal;

/// The shortest interval between two questions to slurmctld.
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Job states after which a step's setup is pointless. Any other state
/// (RUNNING, CONFIGURING, SUSPENDED, a state this list does not know, or no
/// answer) lets the setup go on.
const ENDED_STATES: &[&str] = &[
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "COMPLETING",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
];

/// Watches one step's job while the step's container is set up; stops
/// watching when dropped.
pub struct CancelWatch {
    stop: StopSignal,
    thread: Option<JoinHandle<()>>,
}

impl CancelWatch {
    /// Starts watching job `job` (whose step runs on `nodes` nodes) every
    /// [`interval_for`]`(every, nodes)`; `None` when `every` is zero
    /// (`cancel_check=0`).
    pub fn start(job: u32, nodes: u32, every: Duration) -> Option<CancelWatch> {
        if every.is_zero() {
            return None;
        }
        let interval = interval_for(every, nodes);
        let stop = StopSignal::new();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("berth-cancel-watch".to_string())
            .spawn(move || watch(job, interval, &flag))
            .ok()?;
        Some(CancelWatch {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for CancelWatch {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The interval between two questions for a step on `nodes` nodes: `every`,
/// or longer for large jobs (20 ms per node) so that all the nodes of one
/// job ask slurmctld at most about 50 times a second.
pub fn interval_for(every: Duration, nodes: u32) -> Duration {
    every
        .max(Duration::from_millis(20) * nodes)
        .max(MIN_INTERVAL)
}

fn watch(job: u32, interval: Duration, stop: &StopSignal) {
    while !stop.wait(interval) {
        if let Some(state) = job_state(job).filter(|s| is_ended(s)) {
            crate::interrupt::request(&format!(
                "job {job} ended ({state}) before its container was ready"
            ));
            return;
        }
    }
}

/// The longest an `scontrol show job` may take.
const SCONTROL_TIMEOUT: Duration = Duration::from_secs(20);

/// The job's state as slurmctld reports it, or `None` when it could not be
/// asked (which never stops a setup).
fn job_state(job: u32) -> Option<String> {
    let mut command = Command::new("scontrol");
    command
        .args(["--oneliner", "show", "job", &job.to_string()])
        .env_clear()
        .env(
            "PATH",
            crate::slurm_commands::command_path(
                crate::slurm_commands::bin_dir_beside_stepd().as_deref(),
            ),
        )
        .current_dir("/");
    if let Some(conf) = std::env::var_os("SLURM_CONF") {
        command.env("SLURM_CONF", conf);
    }
    // As root: the job is visible whatever PrivateData says. This thread
    // must not change the process's effective ids (`take_root: false`): the
    // child becomes root by itself, and its alarm bounds a slurmctld that
    // does not answer.
    let options = crate::helper::Options {
        limit: Some(SCONTROL_TIMEOUT),
        take_root: false,
        ..crate::helper::Options::default()
    };
    let output = crate::helper::run(&mut command, crate::helper::RunAs::FullRoot, options).ok()?;
    if !output.status.success() {
        return None;
    }
    parse_job_state(&String::from_utf8_lossy(&output.stdout))
}

/// `JobState=...` of one `scontrol --oneliner show job` line.
fn parse_job_state(text: &str) -> Option<String> {
    text.split_whitespace()
        .find_map(|field| field.strip_prefix("JobState="))
        .map(str::to_string)
}

/// Whether a job in `state` is over (its steps' setups can stop).
fn is_ended(state: &str) -> bool {
    ENDED_STATES.contains(&state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_states_are_read_and_judged() {
        let line = "JobId=12 JobName=x UserId=u(1000) GroupId=u(1000) MCS_label=N/A \
                    Priority=1 Nice=0 Account=(null) QOS=(null) JobState=CANCELLED \
                    Reason=None Dependency=(null) Requeue=1";
        assert_eq!(parse_job_state(line).as_deref(), Some("CANCELLED"));
        assert_eq!(
            parse_job_state("slurm_load_jobs error: Invalid job id"),
            None
        );
        for ended in [
            "CANCELLED",
            "COMPLETING",
            "TIMEOUT",
            "NODE_FAIL",
            "PREEMPTED",
        ] {
            assert!(is_ended(ended), "{ended}");
        }
        for alive in [
            "RUNNING",
            "CONFIGURING",
            "SUSPENDED",
            "PENDING",
            "SOMETHING_NEW",
        ] {
            assert!(!is_ended(alive), "{alive}");
        }
    }

    #[test]
    fn large_jobs_ask_less_often() {
        let every = Duration::from_secs(5);
        assert_eq!(interval_for(every, 1), every);
        assert_eq!(interval_for(every, 250), every);
        assert_eq!(interval_for(every, 1000), Duration::from_secs(20));
        assert_eq!(interval_for(Duration::from_millis(10), 1), MIN_INTERVAL);
    }

    #[test]
    fn a_watch_that_is_off_starts_nothing_and_a_stopped_one_ends() {
        assert!(CancelWatch::start(1, 1, Duration::ZERO).is_none());
        let watch = CancelWatch::start(u32::MAX, 1, Duration::from_secs(3600)).unwrap();
        let started = std::time::Instant::now();
        drop(watch);
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
