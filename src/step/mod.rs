//! One step on one node, as slurmstepd runs it: from a [`Snapshot`] of what
//! Slurm gives and the job's options, decide whether the step runs in a
//! container, get its image (pull, or wait for a fan-out), join, reuse or
//! create a named container, build the spec, start the holder, and, at the
//! end, let go and save. Messages go through [`Report`]; nothing here knows
//! SPANK, so the decisions are tested without Slurm.
//!
//! - `snapshot`: what Slurm gives, copied once; `context`: what the step
//!   works from, made of it;
//! - `report`: the trait the step logs through;
//! - `options`: the raw `--container-*` record; `request`: the same,
//!   resolved once (parsed, defaults applied), what the step reads;
//! - `pin`: the digest submission resolved for the image's tag;
//! - `spec`: the container spec (shared with `berth run`);
//! - `image`: pull or import, and hold; `grants`: a private image's access,
//!   checked once per node per job;
//! - `fanout`: the fan-out roles (`fanout=sbcast`) and their fall back;
//! - `named`: `--container-name` (join, reuse or create), and the epilog;
//! - `manage`: `--container-list` and `--container-remove` (the user's own
//!   named containers, listed or removed by root);
//! - `unnamed`: a step without a name;
//! - `container`: what the tasks join, released and saved at the end;
//! - `handover`: under `contain_spank`, the descriptors handed to
//!   slurmstepd before the step's record is published;
//! - `cancel_watch`: stops a setup whose job ended;
//! - `pmi_dirs`, `task_prolog`, `timings`: PMI folders, the TaskProlog
//!   stand-in, the `srun -v` timings.

use anyhow::anyhow;
pub mod cancel_watch;
pub mod container;
pub mod context;
pub mod fanout;
pub mod grants;
pub mod handover;
pub mod image;
pub mod manage;
pub mod named;
pub mod options;
pub mod pin;
pub mod pmi_dirs;
pub mod report;
pub mod request;
pub mod snapshot;
pub mod spec;
pub mod task_prolog;
pub mod timings;
mod unnamed;

use std::path::PathBuf;
use std::time::Instant;

pub use crate::named::HeldElsewhere;
pub use container::{PendingSave, StepContainer};
pub use context::StepContext;
pub use handover::Handover;
pub use options::JobOptions;
pub use report::Report;
pub use request::StepRequest;
pub use snapshot::{Snapshot, BATCH_STEP, EXTERN_STEP};

use crate::config::Config;
use crate::container::spec::{MountSpec, UserIdentity};
use context::FanoutStep;

/// A step's container, started: what the tasks join, and the site's
/// TaskProlog they run on the host first.
pub struct Started {
    /// What the tasks join.
    pub container: StepContainer,
    /// The site's TaskProlog, when slurm.conf has one.
    pub task_prolog: Option<PathBuf>,
    /// This node's name when the step is verbose (`srun -v`): the first
    /// local task reports its join as it.
    pub join_report: Option<String>,
}

/// Whether a step runs in a container: never the extern step; the batch
/// step only with sbatch support (`sbatch_support`, on by default).
pub fn wants_container(step: u32, options: &JobOptions, config: &Config) -> bool {
    (options.image.is_some() || options.name.is_some())
        && step != EXTERN_STEP
        && (step != BATCH_STEP || config.sbatch_support)
}

/// Sets up the container of this step on this node: `None` when the step
/// runs without one. A scancel or a time limit during the setup stops it.
///
/// With `handover` (`contain_spank`), the container's descriptors go there
/// once it is built, before its record is published.
pub fn start<'a>(
    snapshot: Snapshot,
    mut options: JobOptions,
    config: &'a Config,
    report: &'a dyn Report,
    handover: Option<&'a dyn Handover>,
) -> anyhow::Result<Option<Started>> {
    if let Some(image) = options.image.take() {
        options.image = Some(pin::for_step(&image, snapshot.job_var(pin::PIN_VARIABLE)));
    }
    if !wants_container(snapshot.step, &options, config) {
        return Ok(None);
    }
    let started = Instant::now();
    let (job, step) = (snapshot.job, snapshot.step);
    report.debug(&format!("job {job} step {step}: options {options:?}"));
    let request = StepRequest::resolve(&options, config)?;
    let mut ctx = context(snapshot, request, config, report)?;
    ctx.handover = handover;
    let join_report = ctx.verbose.then(|| ctx.node.clone());
    // Slurm signals nothing before the tasks exist: the watch stops the
    // setup of a job that ended.
    let watch = cancel_watch::CancelWatch::start(job, ctx.node_count, config.cancel_check);
    let started_container = match &ctx.request.name {
        Some(name) => named::start(&ctx, name),
        None => unnamed::start(&ctx),
    };
    drop(watch);
    let (container, what) = started_container.map_err(|e| match crate::interrupt::requested() {
        Some(reason) => anyhow!("container setup stopped: {reason}"),
        None => e,
    })?;
    report.info(&format!(
        "job {job} step {step}: container {what} in {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3,
    ));
    Ok(Some(Started {
        container,
        task_prolog: ctx.task_prolog,
        join_report,
    }))
}

/// The step's context from the snapshot: the user looked up, the save
/// target checked, the batch script, the fan-out role, the TaskProlog.
fn context<'a>(
    snapshot: Snapshot,
    request: StepRequest,
    config: &'a Config,
    report: &'a dyn Report,
) -> anyhow::Result<StepContext<'a>> {
    let (uid, gid) = (snapshot.uid, snapshot.gid);
    let mut user = UserIdentity::lookup(uid, gid)
        .map_err(|e| anyhow!("cannot look up user {uid} on this node: {e:#}"))?;
    if !snapshot.groups.is_empty() {
        user.groups = snapshot.groups.clone();
    }
    let save_to = match &request.save {
        Some(path) => Some(spec::save_target(path, snapshot.cwd.as_deref())?),
        None => None,
    };
    let batch_script = match &snapshot.batch_argv {
        Some(argv) if snapshot.step == BATCH_STEP => Some(batch_script_bind(argv)?),
        _ => None,
    };
    let fanout = FanoutStep::of(&snapshot, config)?;
    let task_prolog = if snapshot.slurm_runs_task_prolog {
        None
    } else {
        task_prolog::site_prolog()?
    };
    let Snapshot {
        job,
        step,
        node,
        node_count,
        job_env,
        cwd,
        verbose,
        ..
    } = snapshot;
    Ok(StepContext {
        config,
        report,
        request,
        store: config.store_path_for_node(&node),
        node_state: config.node_state_path(&node),
        node,
        node_count,
        job,
        step,
        user,
        job_env,
        cwd,
        save_to,
        batch_script,
        fanout,
        verbose,
        task_prolog,
        handover: None,
    })
}

/// The batch script (the first word of the batch step's command line),
/// bound read-only at its own path so that the batch step can run it
/// inside the container.
fn batch_script_bind(argv: &[String]) -> anyhow::Result<MountSpec> {
    let script = argv
        .first()
        .filter(|path| path.starts_with('/'))
        .ok_or_else(|| {
            anyhow!("cannot find the batch script of this job (its command line is {argv:?})")
        })?;
    Ok(MountSpec {
        source: script.into(),
        target: script.into(),
        read_only: true,
    })
}

#[cfg(test)]
mod tests;
