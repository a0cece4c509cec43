//! slurmstepd: read what Slurm gives into a [`Snapshot`], let the core
//! ([`crate::step`]) pull the image and create one container per step and
//! node, join every local task to it, and let go at the last task's exit.
//!
//! `user_init` runs once per step in slurmstepd (uid 0, euid = the user);
//! the container's namespace handles are kept here. Each task, forked from
//! slurmstepd, inherits those handles and joins them in `task_init`. Under
//! `SlurmdParameters=contain_spank`, `user_init` runs in a clone of
//! slurmstepd and the handles travel through [`super::contain`]. When
//! slurmstepd lets go at `exit` and the tasks are gone, the kernel tears
//! every mount down.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use super::handle::{self, Spank};
use super::options;
use crate::config::Config;
use crate::container::env::JOB_LOCALE_VARIABLES;
use crate::step::{Handover, HeldElsewhere, Report, Snapshot, StepContainer};

/// What this slurmstepd keeps between the callbacks of its step (one
/// process runs one step on one node).
struct StepdState {
    /// slurmstepd's own process id, recorded in `init`: `user_init` in
    /// another process is a clone of it (`SlurmdParameters=contain_spank`).
    stepd_pid: u32,
    /// The container of this step on this node, created in `user_init`.
    container: Option<StepContainer>,
    /// Whether `user_init` could not make the container. Slurm 22.05's srun
    /// exits 0 when `user_init` fails (the launch fails, no task runs), so
    /// the failure is reported there and raised again in each task's
    /// `task_init`, which makes the tasks (and so srun) fail with a
    /// non-zero exit code.
    setup_failed: bool,
    /// The site's TaskProlog when this step's tasks run in a container on
    /// Slurm 22.05: each task runs it on the host before it joins
    /// ([`super::task_prolog`]).
    task_prolog: Option<PathBuf>,
    /// This node's name when the step is verbose (`srun -v`): the first
    /// local task reports its join as it.
    join_report: Option<String>,
    /// How many of this node's tasks have exited (the last one saves).
    tasks_exited: u32,
}

/// The one [`StepdState`] of this process.
static STATE: Mutex<StepdState> = Mutex::new(StepdState {
    stepd_pid: 0,
    container: None,
    setup_failed: false,
    task_prolog: None,
    join_report: None,
    tasks_exited: 0,
});

/// This process's [`StepdState`], locked (a panic elsewhere does not lose it).
fn state() -> MutexGuard<'static, StepdState> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records that this process is slurmstepd itself and makes the socket pair
/// a `contain_spank` clone sends its descriptors over (called from `init`).
pub fn record_stepd_process() -> Result<(), String> {
    state().stepd_pid = std::process::id();
    super::contain::open()
}

/// Whether this callback runs in a clone of slurmstepd (contain_spank), not
/// in slurmstepd itself.
fn in_a_clone_of_slurmstepd() -> bool {
    let stepd = state().stepd_pid;
    stepd != 0 && stepd != std::process::id()
}

/// The step's messages, to Slurm's log and srun's terminal.
pub struct SpankReport;

impl Report for SpankReport {
    fn error(&self, message: &str) {
        handle::log_error(message);
    }
    fn info(&self, message: &str) {
        handle::log_info(message);
    }
    fn verbose(&self, message: &str) {
        handle::log_verbose(message);
    }
    fn debug(&self, message: &str) {
        handle::log_debug(message);
    }
    fn user(&self, message: &str) {
        handle::log_user(message);
    }
}

/// Checks the options again in slurmstepd (srun already did).
pub fn init_post_opt(_spank: &Spank) -> Result<(), String> {
    super::local::check_options(&options::current())
}

/// Pulls the image and creates the container for this step on this node. A
/// failure is logged (srun shows it) and failed again in every task.
///
/// A configuration that `slurm_spank_init` found broken (`Err(why)`) fails
/// the steps that want a container, with `why`; the others run.
pub fn user_init(spank: &Spank, config: Result<&Config, &str>) -> Result<(), String> {
    let created = match config {
        Ok(config) => create_container(spank, config),
        Err(why) => refuse_containers(spank, why),
    };
    if let Err(message) = created {
        handle::log_error(&message);
        state().setup_failed = true;
    }
    Ok(())
}

/// With a broken configuration: the step fails with `why` when it wants a
/// container (not the extern step), and runs when it does not.
fn refuse_containers(spank: &Spank, why: &str) -> Result<(), String> {
    let step = spank.step_id().map_err(|e| e.to_string())?;
    if step != crate::step::EXTERN_STEP && super::local::wants_berth(&options::current()) {
        return Err(why.to_string());
    }
    Ok(())
}

fn create_container(spank: &Spank, config: &Config) -> Result<(), String> {
    // Here, not in init_post_opt: the job's environment is readable now.
    options::settle_writable_flags(|name| spank.getenv(name), false)?;
    let options = options::current();
    let step = spank.step_id().map_err(|e| e.to_string())?;
    if crate::step::manage::wanted(&options) {
        // srun only (sbatch and salloc refuse them): never the extern step.
        if step == crate::step::EXTERN_STEP || step == crate::step::BATCH_STEP {
            return Ok(());
        }
        return crate::step::manage::run(&snapshot(spank)?, &options, config, &SpankReport)
            .map_err(|e| format!("{e:#}"));
    }
    if !crate::step::wants_container(step, &options, config) {
        return Ok(());
    }
    super::local::check_slurm_namespaces(&options)?;
    // contain_spank: this clone's descriptors die with it; the step hands
    // them to slurmstepd before it publishes its record.
    let to_slurmstepd = in_a_clone_of_slurmstepd().then(|| ToSlurmstepd {
        stepd_pid: state().stepd_pid,
    });
    let handover = to_slurmstepd.as_ref().map(|h| h as &dyn Handover);
    let Some(started) =
        crate::step::start(snapshot(spank)?, options, config, &SpankReport, handover)
            .map_err(|e| format!("{e:#}"))?
    else {
        return Ok(());
    };
    let mut state = state();
    state.container = Some(started.container);
    state.task_prolog = started.task_prolog;
    state.join_report = started.join_report;
    Ok(())
}

/// `contain_spank`: this `user_init` runs in a clone of slurmstepd whose
/// descriptors die with it. The step's descriptors (the container's
/// namespaces, the image and named holds) go to slurmstepd's socket pair,
/// where the tasks, the `task_exit` clone and later steps joining the
/// container find them ([`super::contain`]).
struct ToSlurmstepd {
    stepd_pid: u32,
}

impl Handover for ToSlurmstepd {
    fn hand_over(&self, fds: &[std::os::fd::RawFd]) -> Result<HeldElsewhere, String> {
        super::contain::send(fds, self.stepd_pid)
    }
}

/// This process's own copies of the step's descriptors (`contain_spank`):
/// a task, or the clone that runs `task_exit`.
fn adopt_sent(step: &mut StepContainer) -> Result<(), String> {
    let fds = super::contain::peek()?;
    step.adopt_descriptors(fds)
        .map_err(|e| format!("contain_spank: {e}"))
}

/// What Slurm tells about this step on this node, read once.
fn snapshot(spank: &Spank) -> Result<Snapshot, String> {
    let step = spank.step_id().map_err(|e| e.to_string())?;
    let batch_argv = if step == crate::step::BATCH_STEP {
        Some(spank.job_argv().map_err(|e| e.to_string())?)
    } else {
        None
    };
    // slurmstepd runs user_init in the job's working directory; a clone of
    // it (contain_spank) is at / after it joined the job's namespace, so
    // there slurmstepd's own folder is read (as root: slurmstepd's real uid
    // is root's), and the job's PWD only when that fails (PWD is what the
    // submitting shell had, not srun's --chdir).
    let cwd = if in_a_clone_of_slurmstepd() {
        let stepd = format!("/proc/{}/cwd", state().stepd_pid);
        crate::privilege::with_root(|| std::fs::read_link(&stepd)).ok()
    } else {
        std::env::current_dir().ok()
    };
    let cwd = cwd
        .or_else(|| spank.getenv("PWD").map(PathBuf::from))
        .filter(|d| d.is_absolute());
    Ok(Snapshot {
        job: spank.job_id().map_err(|e| e.to_string())?,
        step,
        node: node_name(spank),
        node_id: spank.node_id().ok(),
        node_count: spank.node_count().unwrap_or(1),
        uid: spank.uid().map_err(|e| e.to_string())?,
        gid: spank.gid().map_err(|e| e.to_string())?,
        groups: spank.supplementary_gids().unwrap_or_default(),
        job_env: spank.job_env().map_err(|e| e.to_string())?,
        batch_argv,
        cwd,
        verbose: crate::step::timings::step_is_verbose(spank.getenv("SRUN_DEBUG").as_deref()),
        slurm_runs_task_prolog: cfg!(berth_prepend_argv),
    })
}

/// Joins the calling task to the step's container and applies the image env.
pub fn task_init(spank: &Spank, config: &Config) -> Result<(), String> {
    let mut state = state();
    if state.setup_failed {
        return Err("the container could not be set up on this node (see the error above)".into());
    }
    let Some(step) = state.container.as_mut() else {
        return Ok(());
    };
    if super::contain::sent() {
        // This task's own copies of what the user_init clone opened (the
        // socket's copies keep the holds).
        adopt_sent(step)?;
    }
    let state = &*state;
    let Some(step) = state.container.as_ref() else {
        return Ok(());
    };
    let prolog_actions = enter(spank, state, step, config)?;
    set_task_env(spank, step)?;
    super::task_prolog::apply(spank, &prolog_actions)
}

/// Slurm 23.11 and later: the task stays on the host through Slurm's own
/// task setup (the site's TaskProlog runs there, as for a bare task) and
/// enters the container when Slurm execs it, through `berth __enter`
/// prepended to its command. Nothing for berth to apply afterwards: Slurm
/// applies the TaskProlog's output itself.
#[cfg(berth_prepend_argv)]
fn enter(
    spank: &Spank,
    _state: &StepdState,
    step: &StepContainer,
    config: &Config,
) -> Result<Vec<super::task_prolog::Action>, String> {
    let started = std::time::Instant::now();
    let words = step
        .container
        .enter_prefix(&config.helper_path)
        .map_err(|e| format!("cannot prepare the task to enter the container: {e:#}"))?;
    spank
        .prepend_task_argv(&words)
        .map_err(|e| format!("cannot make the task enter the container: {e}"))?;
    if spank.local_task_id().is_ok_and(|id| id == 0) {
        if let (Ok(job), Ok(step)) = (spank.job_id(), spank.step_id()) {
            handle::log_info(&format!(
                "job {job} step {step}: first task prepared to enter the container in {:.1} ms",
                started.elapsed().as_secs_f64() * 1e3
            ));
        }
    }
    Ok(Vec::new())
}

/// Slurm 22.05 (no `spank_prepend_task_argv`): Slurm would run the site's
/// TaskProlog inside the container, after this callback, so berth runs it
/// here on the host instead, then the task joins the container now.
#[cfg(not(berth_prepend_argv))]
fn enter(
    spank: &Spank,
    state: &StepdState,
    step: &StepContainer,
    _config: &Config,
) -> Result<Vec<super::task_prolog::Action>, String> {
    let prolog_actions = match &state.task_prolog {
        Some(path) => match super::task_prolog::run_on_host(spank, path) {
            Ok(actions) => actions,
            Err(failure) => {
                // End the task with the script's status, as Slurm does for
                // a task without a container (it would exit 1 after an
                // error here); the node stays in service either way.
                handle::log_error(&failure.message);
                // SAFETY: this is the task's own process, forked from
                // slurmstepd and about to exec; Slurm itself leaves it with
                // _exit after a failed callback or TaskProlog.
                unsafe { libc::_exit(failure.status) }
            }
        },
        None => Vec::new(),
    };
    let join_started = std::time::Instant::now();
    step.container
        .join()
        .map_err(|e| format!("cannot enter the container: {e:#}"))?;
    if spank.local_task_id().is_ok_and(|id| id == 0) {
        let joined = join_started.elapsed();
        if let (Ok(job), Ok(step)) = (spank.job_id(), spank.step_id()) {
            handle::log_info(&format!(
                "job {job} step {step}: first task joined the container in {:.1} ms",
                joined.as_secs_f64() * 1e3
            ));
        }
        if let Some(node) = &state.join_report {
            handle::log_user(&crate::step::timings::join_line(node, joined));
        }
    }
    Ok(prolog_actions)
}

/// The task's environment in the container: the image's, the entrypoint's
/// changes, enroot's PMIx and PyTorch hooks.
fn set_task_env(spank: &Spank, step: &StepContainer) -> Result<(), String> {
    let keeps =
        |name: &str| step.keep_job_env.iter().any(|n| n == name) && spank.getenv(name).is_some();
    // The job's locale stays outside unless --container-env names it (as
    // with pyxis): the image may lack that locale.
    for locale in JOB_LOCALE_VARIABLES {
        if !step.keep_job_env.iter().any(|n| n == locale) && spank.getenv(locale).is_some() {
            spank.unsetenv(locale).map_err(|e| e.to_string())?;
        }
    }
    for (name, value) in step.container.env(std::iter::empty()) {
        if keeps(&name) {
            continue;
        }
        spank.setenv(&name, &value).map_err(|e| e.to_string())?;
    }
    if let Some(outcome) = step.container.entrypoint_outcome() {
        for (name, value) in outcome.set.iter().filter(|(name, _)| !keeps(name)) {
            spank.setenv(name, value).map_err(|e| e.to_string())?;
        }
        for name in outcome.unset.iter().filter(|name| !keeps(name)) {
            spank.unsetenv(name).map_err(|e| e.to_string())?;
        }
    }
    // enroot's PMIx and PyTorch hooks, per task (Slurm's MPI plugin set
    // this task's PMIX_* before this callback).
    let task_value = |name: &str| spank.getenv(name);
    let hooks = crate::container::taskhooks::pmix_mca_env(task_value)
        .into_iter()
        .chain(crate::container::taskhooks::pytorch_env(task_value));
    for (name, value) in hooks {
        spank.setenv(&name, &value).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// After each local task: the last one lets go of the container and, with
/// `--container-save`, saves its root file system.
pub fn task_exit(spank: &Spank) -> Result<(), String> {
    let tasks = spank.local_task_count().map_err(|e| e.to_string())?;
    let step = {
        let mut state = state();
        state.tasks_exited += 1;
        if state.tasks_exited < tasks {
            return Ok(());
        }
        state.container.take()
    };
    let Some(mut step) = step else {
        return Ok(());
    };
    if super::contain::sent() {
        // A clone of slurmstepd (contain_spank): the numbers held are the
        // user_init clone's; release this clone's own copies. slurmstepd's
        // exit lets the socket's copies go.
        if let Err(e) = adopt_sent(&mut step) {
            std::mem::forget(step);
            return Err(e);
        }
    }
    step.release(&SpankReport).map_err(|e| format!("{e:#}"))
}

/// Lets go of the container's namespaces (if the tasks did not already).
pub fn exit() {
    let step = state().container.take();
    if super::contain::sent() {
        // Numbers of the user_init clone's table, not of slurmstepd's.
        std::mem::forget(step);
        super::contain::close();
        return;
    }
    drop(step);
}

/// This node's name, for `%n` in `store_path` and for messages: the host's
/// short name. Not `SLURMD_NODENAME` from the job environment: before the
/// tasks start it is whatever the submitting process had, e.g. the batch
/// node's name in every step an sbatch script launches.
fn node_name(spank: &Spank) -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    match host.split('.').next() {
        Some(short) if !short.is_empty() => short.to_string(),
        _ => spank.getenv("SLURMD_NODENAME").unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::ffi;

    #[test]
    fn the_core_knows_slurms_special_step_ids() {
        assert_eq!(crate::step::BATCH_STEP, ffi::SLURM_BATCH_SCRIPT);
        assert_eq!(crate::step::EXTERN_STEP, ffi::SLURM_EXTERN_CONT);
    }
}
