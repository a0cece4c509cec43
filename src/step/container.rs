//! What the tasks of a step join, and what happens when the last one is
//! done: the namespaces go, then the named container's record, then the
//! `--container-save`, then the image hold.

use anyhow::anyhow;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use super::context::StepContext;
use super::handover::Handover;
use super::report::Report;
use crate::container::save::{SaveRequest, SAVE_ARG};
use crate::container::Container;
use crate::named::running::Publication;
use crate::named::HeldElsewhere;
use crate::privilege::with_root;
use crate::store::ImageHold;

/// The container of one step on one node, and what it holds.
pub struct StepContainer {
    /// The container's namespaces, which every task joins.
    pub container: Container,
    /// `--container-env`: variables whose job value wins over the image's.
    pub keep_job_env: Vec<String>,
    /// Keeps `berth rmi` and `berth gc` off the image while the step runs.
    pub image_hold: Option<ImageHold>,
    /// A named container's record and hold, released with the container.
    pub named: Option<NamedUse>,
    /// `--container-save`: done after the last local task.
    pub save: Option<PendingSave>,
}

/// What a step using a named container holds until it lets go.
pub struct NamedUse {
    /// This step's record, once published: later steps may join through it.
    pub publication: Option<Publication>,
    /// A shared lock on the container's folder: `berth containers rm` waits.
    pub hold: Option<File>,
}

/// A `--container-save` to do when the step's tasks are done.
pub struct PendingSave {
    /// What to save, where.
    pub request: SaveRequest,
    /// The on-disk upper folder of an unnamed step, removed after the save.
    pub scratch: Option<PathBuf>,
    /// The berth helper that saves (full root; it writes as the user).
    pub helper: PathBuf,
    /// This node's name, for the messages.
    pub node: String,
}

impl StepContainer {
    /// Every descriptor this step holds, in a fixed order: the container's
    /// namespaces, the image hold, the named container's hold. A clone of
    /// slurmstepd (`contain_spank`) sends them to slurmstepd.
    pub fn descriptors(&self) -> Vec<RawFd> {
        let mut fds: Vec<RawFd> = self
            .container
            .namespace_fds()
            .into_iter()
            .map(|(_, fd)| fd)
            .collect();
        fds.extend(self.image_hold.as_ref().map(|h| h.file().as_raw_fd()));
        fds.extend(
            self.named
                .as_ref()
                .and_then(|n| n.hold.as_ref())
                .map(|f| f.as_raw_fd()),
        );
        fds
    }

    /// Hands [`StepContainer::descriptors`] over with `handover` (the
    /// step's, `contain_spank`); `None` when there is none and this process
    /// keeps them.
    pub fn hand_over(
        &self,
        handover: Option<&dyn Handover>,
    ) -> anyhow::Result<Option<HeldElsewhere>> {
        let Some(handover) = handover else {
            return Ok(None);
        };
        handover
            .hand_over(&self.descriptors())
            .map(Some)
            .map_err(anyhow::Error::msg)
    }

    /// Takes `fds`, this process's copies of [`StepContainer::descriptors`]
    /// in that order, in place of the numbers held (another process's:
    /// forgotten, never closed).
    pub fn adopt_descriptors(&mut self, fds: Vec<OwnedFd>) -> Result<(), String> {
        let want = self.descriptors().len();
        if fds.len() != want {
            return Err(format!(
                "expected {want} descriptors of the step's container, got {}",
                fds.len()
            ));
        }
        let namespaces = self.container.namespace_fds().len();
        let mut fds = fds.into_iter();
        self.container
            .adopt_namespace_fds(fds.by_ref().take(namespaces).collect())
            .map_err(|e| format!("{e:#}"))?;
        if let Some(hold) = &mut self.image_hold {
            hold.adopt_file(fds.next().expect("counted above"));
        }
        if let Some(hold) = self.named.as_mut().and_then(|n| n.hold.as_mut()) {
            let fd = fds.next().expect("counted above");
            std::mem::forget(std::mem::replace(hold, File::from(fd)));
        }
        Ok(())
    }

    /// Lets go of the container after the step's last local task, in
    /// order: the namespaces (the saved tree must not change any more), the
    /// named record, the save, its scratch folder, the image hold.
    pub fn release(self, report: &dyn Report) -> anyhow::Result<()> {
        let StepContainer {
            container,
            image_hold,
            named,
            save,
            ..
        } = self;
        drop(container);
        drop(named);
        let result = match &save {
            Some(save) => save_root(save, report),
            None => Ok(()),
        };
        if let Some(scratch) = save.and_then(|s| s.scratch) {
            let _ = with_root(|| std::fs::remove_dir_all(&scratch));
        }
        drop(image_hold);
        result
    }
}

/// Runs the save helper (full root; it writes the file as the user).
fn save_root(save: &PendingSave, report: &dyn Report) -> anyhow::Result<()> {
    let started = Instant::now();
    let request = &save.request;
    let json = serde_json::to_string(request)?;
    let mut command = Command::new(&save.helper);
    command
        .arg(SAVE_ARG)
        .arg(json)
        .stdin(Stdio::null())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    crate::privilege::run_as_full_root(&mut command);
    let output = with_root(|| command.output()).map_err(|e| {
        anyhow!(
            "--container-save: cannot run the berth helper {}: {e:#}",
            save.helper.display()
        )
    })?;
    let node = &save.node;
    if !output.status.success() {
        return Err(anyhow!(
            "--container-save: could not save the container to {} on {node}: {}",
            request.output.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    for line in String::from_utf8_lossy(&output.stderr).lines() {
        if let Some(note) = line.strip_prefix("berth: ") {
            report.user(note);
        }
    }
    report.info(&format!(
        "saved the container to {} on {node} in {:.1} s",
        request.output.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Tells what the container's start did: the holder's warnings (an image
/// that could not be idmapped) to the user, one line each with the node's
/// name; its mount table to the log at `log_level=debug`, one
/// `mount SOURCE TARGET TYPE OPTIONS # WHY` line per mount; what the image
/// ENTRYPOINT did to the log and, with `--container-entrypoint-log`, its
/// output to the user.
pub fn report_start(ctx: &StepContext, container: &Container) {
    if let Some(outcome) = container.entrypoint_outcome() {
        let (job, step) = (ctx.job, ctx.step);
        ctx.report.verbose(&format!(
            "job {job} step {step}: the image ENTRYPOINT ran: {} variables set, {} removed",
            outcome.set.len(),
            outcome.unset.len()
        ));
        let names: Vec<&str> = outcome.set.iter().map(|(n, _)| n.as_str()).collect();
        ctx.report.debug(&format!(
            "job {job} step {step}: ENTRYPOINT set {names:?}, removed {:?}",
            outcome.unset
        ));
        if ctx.request.entrypoint_log {
            for line in outcome.log.lines() {
                ctx.report.user(&format!("entrypoint: {line}"));
            }
        }
    }
    for line in container.mount_table() {
        ctx.report
            .debug(&format!("job {} step {}: mount {line}", ctx.job, ctx.step));
    }
    for warning in container.warnings() {
        ctx.report
            .user(&format!("{}: warning: {warning}", ctx.node));
    }
}
