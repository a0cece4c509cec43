//! slurmstepd's side of fan-out (`fanout=sbcast`, see [`crate::fanout`]):
//! which role this node plays in a step, and the fall back to an ordinary
//! registry pull whenever the fan-out does not deliver.
//!
//! Every node first asks its own store (`berth pull --cached-only`: one
//! manifest request, as any pull by tag makes): a node that has the image
//! starts at once, whatever the others do. A first node (`SLURM_NODEID` 0)
//! that lacks it says so to the others (the intent), pulls, and sends the
//! squashfs; the other nodes that lack it wait for that, bounded by
//! `fanout_intent_wait` (no intent: the first node had the image) and
//! `fanout_wait`.

use anyhow::anyhow;
use std::process::{Command, Stdio};
use std::time::Instant;

use super::context::{FanoutStep, StepContext};
use super::image::{self, run_pull, HeldImage};
use super::request::RequestedImage;
use crate::config::Config;
use crate::fanout::{JobUser, ReceiveRequest, SendRequest, SendWhat, FANOUT_ARG};
use crate::privilege::with_root;
use crate::puller::Answer;
use crate::reference::ImageSource;
use crate::store::StoredImage;

/// Pulls the step's image (fanning it out when the step does) and holds it.
pub fn pull_and_hold(ctx: &StepContext, image: &RequestedImage) -> anyhow::Result<HeldImage> {
    let step = match &ctx.fanout {
        Some(step) if matches!(image.value, ImageSource::Registry(_)) => step,
        _ => return image::pull_and_hold(ctx, image),
    };
    let (missing, lookup) = match run_pull(ctx, image, true)? {
        (Answer::Stored(stored), lookup) => return image::hold(ctx, image, *stored, lookup),
        (Answer::NotInStore(digest), lookup) => (digest, lookup),
    };
    if step.node_id == 0 {
        send_side(ctx, step, image, missing)
    } else {
        receive_side(ctx, step, image, missing, lookup)
    }
}

/// The first node: announce, pull, send (or say that nothing comes).
fn send_side(
    ctx: &StepContext,
    step: &FanoutStep,
    image: &RequestedImage,
    digest: String,
) -> anyhow::Result<HeldImage> {
    if let Err(e) = send(
        ctx,
        step,
        image,
        SendWhat::Intent {
            manifest_digest: digest,
        },
    ) {
        ctx.report
            .info(&format!("fan-out: cannot announce the pull: {e:#}"));
    }
    match image::pull_and_hold(ctx, image) {
        Ok(held) => {
            let what = SendWhat::Image {
                manifest_digest: held.stored.manifest_digest.clone().unwrap_or_default(),
            };
            match send(ctx, step, image, what) {
                Ok(report) => ctx.report.info(&format!("{}: fan-out: {report}", ctx.node)),
                Err(e) => ctx.report.user(&format!(
                    "{}: fan-out: could not send {image} to the step's nodes (they pull it \
                     themselves): {e:#}",
                    ctx.node
                )),
            }
            Ok(held)
        }
        Err(error) => {
            let what = SendWhat::Nothing {
                reason: format!("its pull failed: {error:#}"),
            };
            if let Err(e) = send(ctx, step, image, what) {
                ctx.report
                    .info(&format!("fan-out: cannot tell the others: {e:#}"));
            }
            Err(error)
        }
    }
}

/// Another node: wait for the first node's squashfs, else pull.
fn receive_side(
    ctx: &StepContext,
    step: &FanoutStep,
    image: &RequestedImage,
    digest: String,
    lookup: Option<super::timings::Lookup>,
) -> anyhow::Result<HeldImage> {
    let started = Instant::now();
    let request = ReceiveRequest {
        store: ctx.store.clone(),
        fanout_dir: ctx.config.fanout_dir(&ctx.node),
        job: ctx.job,
        step: ctx.step,
        user: job_user(ctx),
        node_id: step.node_id,
        image: image.to_string(),
        manifest_digest: digest,
        intent_wait: ctx.config.fanout.intent_wait,
        wait: ctx.config.fanout.wait,
    };
    match run_helper("receive", &request, ctx.config) {
        Ok(stdout) => {
            let stored: StoredImage = serde_json::from_str(&stdout)
                .map_err(|e| anyhow!("the fan-out helper gave an unreadable answer: {e:#}"))?;
            ctx.report.user(&format!(
                "{}: {image}: received from the step's first node in {:.1} s",
                ctx.node,
                started.elapsed().as_secs_f64()
            ));
            image::hold(ctx, image, stored, lookup)
        }
        Err(reason) => {
            ctx.report.user(&format!(
                "{}: fan-out: {reason:#}; pulling {image} from the registry",
                ctx.node
            ));
            image::pull_and_hold(ctx, image)
        }
    }
}

fn job_user(ctx: &StepContext) -> JobUser {
    JobUser {
        uid: ctx.user.uid,
        gid: ctx.user.gid,
    }
}

/// Runs the send helper; its report on success.
fn send(
    ctx: &StepContext,
    step: &FanoutStep,
    image: &RequestedImage,
    what: SendWhat,
) -> anyhow::Result<String> {
    let request = SendRequest {
        store: ctx.store.clone(),
        fanout_dir: ctx.config.fanout_dir(&ctx.node),
        job: ctx.job,
        step: ctx.step,
        user: job_user(ctx),
        sender: ctx.node.clone(),
        image: image.to_string(),
        node_count: step.node_count,
        slurm_conf: step.slurm_conf.clone(),
        slurm_bin: crate::slurm_commands::bin_dir_beside_stepd(),
        what,
    };
    run_helper("send", &request, ctx.config)
}

/// Runs `berth __fanout VERB JSON` as full root: its stdout (receive) or
/// its stderr (send's report) on success, its stderr as the error.
fn run_helper(
    verb: &str,
    request: &impl serde::Serialize,
    config: &Config,
) -> anyhow::Result<String> {
    with_root(|| run_helper_as_root(verb, request, config))
}

fn run_helper_as_root(
    verb: &str,
    request: &impl serde::Serialize,
    config: &Config,
) -> anyhow::Result<String> {
    let json = serde_json::to_string(request)?;
    let mut command = Command::new(&config.helper_path);
    command
        .arg(FANOUT_ARG)
        .arg(verb)
        .arg(json)
        .stdin(Stdio::null())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    crate::privilege::run_as_full_root(&mut command);
    let output = crate::interrupt::output(&mut command).map_err(|e| {
        if e.kind() == std::io::ErrorKind::Interrupted {
            return anyhow!("fan-out stopped: {e:#}");
        }
        anyhow!(
            "cannot run the berth helper {}: {e:#}",
            config.helper_path.display()
        )
    })?;
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    if !output.status.success() {
        return Err(anyhow::Error::msg(stderr));
    }
    Ok(match verb {
        "receive" => String::from_utf8_lossy(&output.stdout).into_owned(),
        _ => stderr,
    })
}
