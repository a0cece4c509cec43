//! A step without `--container-name`: pull (or receive) the image, build
//! the container, publish it as `JOB.STEP` for the job's other steps, and
//! with `--container-save` keep its changes in a scratch folder on disk.

use anyhow::anyhow;
use std::time::Instant;

use super::container::{report_start, PendingSave, StepContainer};
use super::context::StepContext;
use super::spec::{build_spec, save_request};
use crate::container::{spawn_holder, Mode};
use crate::named::NamedRoots;
use crate::privilege::with_root;

/// Starts the container of an unnamed step; returns it and what was done,
/// for the log.
pub fn start(ctx: &StepContext) -> anyhow::Result<(StepContainer, String)> {
    let Some(image) = &ctx.request.image else {
        anyhow::bail!("a step without --container-name needs --container-image");
    };
    ctx.report.verbose(&format!(
        "job {} step {}: pulling {image} into {}",
        ctx.job,
        ctx.step,
        ctx.store.display()
    ));
    let pull_started = Instant::now();
    let super::image::HeldImage {
        stored,
        hold: image_hold,
        lookup,
    } = super::fanout::pull_and_hold(ctx, image)?;
    let pulled = pull_started.elapsed();
    let mut spec = build_spec(ctx, &stored, image_hold.as_ref())?;
    let mut save = None;
    if let Some(output) = &ctx.save_to {
        let scratch = with_root(|| {
            NamedRoots::new(&ctx.node_state).save_scratch(ctx.user.uid, ctx.job, ctx.step)
        })
        .map_err(|e| anyhow!("--container-save: {e:#}"))?;
        spec.upper_dir = Some(scratch.clone());
        save = Some(PendingSave {
            request: save_request(&spec, &scratch, output),
            scratch: Some(scratch),
            helper: ctx.config.helper_path.clone(),
            node: ctx.node.clone(),
        });
    }
    // spawn_holder takes root for the mounts and the id maps itself.
    let mount_started = Instant::now();
    let container = spawn_holder(&ctx.config.helper_path, &spec, Mode::Privileged)
        .map_err(|e| anyhow!("cannot start the container for image '{image}': {e:#}"))?;
    let mounted = mount_started.elapsed();
    if ctx.verbose {
        let shown = stored
            .reference
            .as_ref()
            .map_or_else(|| image.text.clone(), ToString::to_string);
        ctx.report.user(&super::timings::setup_line(
            &ctx.node, &shown, lookup, pulled, mounted,
        ));
    }
    report_start(ctx, &container);
    let mut step = StepContainer {
        container,
        keep_job_env: ctx.request.keep_env.clone(),
        image_hold,
        named: None,
        save,
    };
    let held = step.hand_over(ctx.handover)?;
    // Other steps of the job may join it as `--container-name=JOB.STEP`.
    step.named = super::named::publish_unnamed(ctx, &step.container, &spec, held.as_ref())
        .map_err(|e| ctx.report.error(&format!("{e:#}")))
        .ok();
    let what = format!(
        "for image {image} ({}) ready ({})",
        stored.manifest_digest.as_deref().unwrap_or("squashfs file"),
        super::timings::stages(lookup, pulled, mounted)
    );
    Ok((step, what))
}
