//! slurmstepd, `--container-name`: join, reuse or create a named container
//! (see [`crate::named`] for where they live and how a running one is found).
//!
//! Everything runs as root under the name's decision lock: find the steps
//! that run it, load its folder, [`decide`], then join the running step's
//! namespaces or build a container on the kept root, and publish this step's
//! record so later steps can join it too.

use anyhow::anyhow;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::container::{report_start, NamedUse, PendingSave, StepContainer};
use super::context::StepContext;
use super::image::pull_and_hold;
use super::report::Report;
use super::request::RequestedImage;
use super::spec::{build_spec, save_request};
use crate::config::{Config, ContainerScope};
use crate::container::{spawn_holder, Container, ContainerSpec, Mode};
use crate::fsutil::FileLock;
use crate::named::{
    decide, Action, ContainerName, HeldElsewhere, NameFlag, NamedKey, NamedMeta, NamedRoot,
    NamedRoots, Registry, RunningStep, Scope,
};
use crate::privilege::with_root;
use crate::store::{ImageHold, StoredImage};

/// How long a `NAME:no_exec` step waits at most for the step that runs the
/// container to end (berth mounts a kept root once at a time).
const NO_EXEC_WAIT: Duration = Duration::from_secs(60);

/// How often that wait looks again.
const NO_EXEC_POLL: Duration = Duration::from_millis(100);

/// Starts this step in the named container `name`; returns the container
/// and what was done (joined, reused, created), for the log.
pub fn start(ctx: &StepContext, name: &ContainerName) -> anyhow::Result<(StepContainer, String)> {
    let key = NamedKey {
        uid: ctx.user.uid,
        scope: scope_of(&name.name, ctx.job, ctx.config.container_scope),
        name: name.name.clone(),
    };
    with_root(|| start_as_root(ctx, name, &key))
}

/// The scope of container `name` in job `job`: the job's for `JOB.STEP`
/// of this job (an unnamed step's container), else the site's
/// `container_scope`.
pub fn scope_of(name: &str, job: u32, container_scope: ContainerScope) -> Scope {
    if !is_unnamed_step_name(name, job) && container_scope == ContainerScope::Global {
        Scope::Global
    } else {
        Scope::Job(job)
    }
}

/// Whether `name` is `JOB.STEP` of this job: the name pyxis gives the
/// container of an unnamed step, which other steps of the job may join.
pub fn is_unnamed_step_name(name: &str, job: u32) -> bool {
    name.split_once('.').is_some_and(|(j, step)| {
        j == job.to_string() && !step.is_empty() && step.bytes().all(|b| b.is_ascii_digit())
    })
}

/// The key under which an unnamed step's container is published: its
/// user's, in its job, named `JOB.STEP`.
fn unnamed_key(uid: u32, job: u32, step: u32) -> NamedKey {
    NamedKey {
        uid,
        scope: Scope::Job(job),
        name: format!("{job}.{step}"),
    }
}

/// Publishes the container of an unnamed step, so that another step of the
/// same user and job joins it with `--container-name=JOB.STEP` (as with
/// pyxis). Nothing is kept on disk: the record goes with the step.
///
/// `held`: where the container's descriptors went ([`super::handover`]).
pub fn publish_unnamed(
    ctx: &StepContext,
    container: &Container,
    spec: &ContainerSpec,
    held: Option<&HeldElsewhere>,
) -> anyhow::Result<NamedUse> {
    let key = unnamed_key(ctx.user.uid, ctx.job, ctx.step);
    let describe = |e: anyhow::Error| {
        anyhow!(
            "cannot publish the container of step {}.{} for other steps to join: {e:#}",
            ctx.job,
            ctx.step
        )
    };
    with_root(|| {
        let registry = Registry::new(&ctx.config.runtime_dir, &ctx.node);
        let record = RunningStep::of_container(container, spec, ctx.job, ctx.step, held)
            .map_err(describe)?;
        let publication = registry.publish(&key, &record).map_err(describe)?;
        Ok(NamedUse {
            publication: Some(publication),
            hold: None,
        })
    })
}

/// Takes the decision lock of `key` and returns it with the steps that run
/// the container. For `no_exec`, first waits (up to [`NO_EXEC_WAIT`]) until
/// no step runs it: a second container on the kept root must wait for the
/// first one's overlay to go.
fn lock_and_look(
    registry: &Registry,
    key: &NamedKey,
    name: &ContainerName,
    ctx: &StepContext,
) -> anyhow::Result<(FileLock, Vec<RunningStep>)> {
    let started = Instant::now();
    let mut told = false;
    loop {
        let decision = registry.lock(key)?;
        let running = registry.running(key)?;
        if name.flag != NameFlag::NoExec
            || running.is_empty()
            || started.elapsed() >= NO_EXEC_WAIT
            || crate::interrupt::requested().is_some()
        {
            return Ok((decision, running));
        }
        drop(decision);
        if !told {
            ctx.report.user(&format!(
                "{}: --container-name={}:no_exec: waiting (up to {} s) for step {}.{} to let go \
                 of the container",
                ctx.node,
                key.name,
                NO_EXEC_WAIT.as_secs(),
                running[0].job,
                running[0].step
            ));
            told = true;
        }
        std::thread::sleep(NO_EXEC_POLL);
    }
}

fn start_as_root(
    ctx: &StepContext,
    name: &ContainerName,
    key: &NamedKey,
) -> anyhow::Result<(StepContainer, String)> {
    let describe = |e: anyhow::Error| anyhow!("named container {}: {e:#}", key.describe());
    let registry = Registry::new(&ctx.config.runtime_dir, &ctx.node);
    let roots = NamedRoots::new(&ctx.node_state);
    let (_decision, running) = lock_and_look(&registry, key, name, ctx).map_err(describe)?;
    let existing = roots.load(key).map_err(describe)?;
    let action = decide(
        name,
        existing.is_some(),
        !running.is_empty(),
        ctx.request.image.is_some(),
    )
    .map_err(anyhow::Error::msg)?;
    let hold = |root: &NamedRoot| root.hold().map_err(describe);
    let (container, spec, holds, image_hold, what) = match (action, existing) {
        (Action::Join, existing) => {
            let record = &running[0];
            refuse_missing_namespaces(ctx, key, record)?;
            let mut spec = record.spec.clone();
            if let Some(workdir) = &ctx.request.workdir {
                spec.workdir = Some(workdir.clone());
            }
            if let Some(mounts) = &ctx.request.mounts {
                ctx.report.user(&format!(
                    "{}: warning: ignoring --container-mounts={mounts}: container '{}' is \
                     already running (step {}.{}) and keeps its mounts",
                    ctx.node, key.name, record.job, record.step
                ));
            }
            let container = record.open_with(&spec).map_err(describe)?;
            let holds = existing.as_ref().map(hold).transpose()?;
            let what = format!(
                "'{}' joined (running in step {}.{})",
                key.name, record.job, record.step
            );
            (container, spec, holds, None, what)
        }
        (Action::Reuse, Some(root)) => {
            let held = hold(&root)?;
            let (stored, image_hold) = root_image(ctx, &root)?;
            let (container, spec) = build(ctx, &stored, image_hold.as_ref(), &root)?;
            let what = format!("'{}' started on its kept root", key.name);
            (container, spec, Some(held), image_hold, what)
        }
        (_, _) => {
            let Some(image) = &ctx.request.image else {
                anyhow::bail!(
                    "named container '{}' does not exist on this node: give --container-image \
                     to create it",
                    key.name
                );
            };
            let held = pull_and_hold(ctx, image)?;
            let (stored, image_hold) = (held.stored, held.hold);
            let meta = NamedMeta {
                name: key.name.clone(),
                uid: key.uid,
                scope: key.scope,
                image: image.text.clone(),
                manifest_digest: stored.manifest_digest.clone(),
                squashfs: stored.squashfs.clone(),
                created: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            };
            let root = roots.create(key, &meta).map_err(describe)?;
            let held = hold(&root)?;
            let (container, spec) = build(ctx, &stored, image_hold.as_ref(), &root)?;
            let what = format!("'{}' created from {image}", key.name);
            (container, spec, Some(held), image_hold, what)
        }
    };
    let save = ctx.save_to.as_ref().map(|output| {
        let overlay_dir = roots.dir(key);
        PendingSave {
            request: save_request(&spec, &overlay_dir, output),
            scratch: None,
            helper: ctx.config.helper_path.clone(),
            node: ctx.node.clone(),
        }
    });
    let mut step = StepContainer {
        container,
        keep_job_env: ctx.request.keep_env.clone(),
        image_hold,
        named: Some(NamedUse {
            publication: None,
            hold: holds,
        }),
        save,
    };
    // Still under the decision lock: no other step decides on this name
    // before the record says that this one runs it.
    let held = step.hand_over(ctx.handover)?;
    let record =
        RunningStep::of_container(&step.container, &spec, ctx.job, ctx.step, held.as_ref())
            .map_err(describe)?;
    let publication = registry.publish(key, &record).map_err(describe)?;
    if let Some(named) = &mut step.named {
        named.publication = Some(publication);
    }
    Ok((step, what))
}

/// `--container-unshare` when joining a running container: each kind asked
/// for must be a namespace of the container's own, or the step would run in
/// the node's (pyxis refuses too).
fn refuse_missing_namespaces(
    ctx: &StepContext,
    key: &NamedKey,
    record: &RunningStep,
) -> anyhow::Result<()> {
    let Some(list) = &ctx.request.unshare else {
        return Ok(());
    };
    let missing: Vec<&str> = list
        .value
        .iter()
        .map(|kind| kind.name())
        .filter(|name| !record.namespaces.iter().any(|ns| ns.kind == *name))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(anyhow!(
        "--container-unshare={list}: container '{}' is already running (step {}.{}) without \
         its own {} namespace, and a joining step cannot get one; run this step without \
         --container-unshare={}, or start the container with it (in its first step)",
        key.name,
        record.job,
        record.step,
        missing.join(", "),
        missing.join(","),
    ))
}

/// Builds a container on the kept root of `root`, from `stored` (held by
/// `image_hold`).
fn build(
    ctx: &StepContext,
    stored: &StoredImage,
    image_hold: Option<&ImageHold>,
    root: &NamedRoot,
) -> anyhow::Result<(Container, ContainerSpec)> {
    let mut spec = build_spec(ctx, stored, image_hold)?;
    spec.upper_dir = Some(root.overlay_dir().to_path_buf());
    let container =
        spawn_holder(&ctx.config.helper_path, &spec, Mode::Privileged).map_err(|e| {
            anyhow!(
                "cannot start named container '{}' (image {}): {e:#}",
                root.meta.name,
                root.meta.image
            )
        })?;
    report_start(ctx, &container);
    Ok((container, spec))
}

/// The image a named container was made from: from the store by digest
/// when it is still there, else pulled again (and it must be the same).
fn root_image(
    ctx: &StepContext,
    root: &NamedRoot,
) -> anyhow::Result<(StoredImage, Option<ImageHold>)> {
    let store = &ctx.store;
    let meta = &root.meta;
    if let Some(digest) = &meta.manifest_digest {
        let opened = crate::store::Store::open_unswept(store)?;
        if let Some(stored) = opened.lookup_digest(digest)? {
            if let Ok(hold) = opened.hold(&stored) {
                return Ok((stored, Some(hold)));
            }
        }
    }
    let held = pull_and_hold(ctx, &RequestedImage::parse(&meta.image)?)?;
    let (stored, hold) = (held.stored, held.hold);
    if stored.manifest_digest != meta.manifest_digest {
        return Err(anyhow!(
            "named container '{}' was made from image {} ({}), which is no longer in the node \
             store, and {} now names another image ({}); remove the container (berth \
             containers rm) or use another name",
            meta.name,
            meta.image,
            meta.manifest_digest.as_deref().unwrap_or("a squashfs file"),
            meta.image,
            stored
                .manifest_digest
                .as_deref()
                .unwrap_or("a squashfs file"),
        ));
    }
    Ok((stored, hold))
}

/// slurmd's job epilog on each node (root): removes the job-scoped named
/// containers of the job and their records. Their mounts are already gone:
/// they lived only in the namespaces of the job's steps.
pub fn job_epilog(job: u32, config: &Config, report: &dyn Report) -> anyhow::Result<()> {
    let node = std::env::var("SLURMD_NODENAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .map(|h| h.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let store = config.node_state_path(&node);
    let removed = NamedRoots::new(&store)
        .remove_job(job)
        .map_err(|e| anyhow!("cannot remove the named containers of job {job}: {e:#}"))?;
    // An untrusted runtime folder is the admin's to fix; it must not drain
    // the node: logged, not failed.
    if let Err(e) = Registry::new(&config.runtime_dir, &node).remove_job(job) {
        report.error(&format!("cannot remove the records of job {job}: {e:#}"));
    }
    if let Err(e) = super::grants::Grants::new(&config.runtime_dir, &node).remove_job(job) {
        report.error(&format!(
            "cannot remove the image grants of job {job}: {e:#}"
        ));
    }
    if !removed.is_empty() {
        report.verbose(&format!(
            "job {job}: removed its named containers on {node}"
        ));
    }
    // Never fails the epilog (that would drain the node): what the job's
    // user left in their fan-out folder is logged and left.
    let cleanup = crate::fanout::remove_job(&config.fanout_dir(&node), job);
    for mount in &cleanup.detached {
        report.info(&format!(
            "job {job}: detached the mount {} its user left in the fan-out folder",
            mount.display()
        ));
    }
    for left in &cleanup.left {
        report.error(&format!("job {job}: fan-out folder: {left}"));
    }
    Ok(())
}
