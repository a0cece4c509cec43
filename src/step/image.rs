//! The step's image: pulled into the node store as the pull user (with the
//! job user's credentials), or a user's squashfs file re-packed into it,
//! then held for the step's time (`berth rmi` and `berth gc` wait).

use anyhow::anyhow;
use std::path::{Path, PathBuf};

use super::context::StepContext;
use super::grants::Grants;
use super::request::RequestedImage;
use super::timings::Lookup;
use crate::helper::PullSettings;
use crate::privilege::with_root;
use crate::puller::{Answer, CredentialsFrom, PullRequest};
use crate::reference::{ImageRef, ImageSource};
use crate::store::{ImageHold, Store, StoredImage};

/// The step's image: stored, held for the step (`None`: a squashfs file
/// given by path, outside the store), and how long the pull's registry
/// lookup took, when it made one.
pub struct HeldImage {
    /// The image as the store has it.
    pub stored: StoredImage,
    /// The step's shared hold on it.
    pub hold: Option<ImageHold>,
    /// The registry lookup the pull helper reported (`srun -v`).
    pub lookup: Option<Lookup>,
}

/// Pulls the image and takes a shared hold on it for the step. `berth gc` may
/// remove an image between the pull and the hold: then pull once more.
pub fn pull_and_hold(ctx: &StepContext, image: &RequestedImage) -> anyhow::Result<HeldImage> {
    let (stored, lookup) = pull(ctx, image)?;
    hold(ctx, image, stored, lookup)
}

/// Takes a shared hold on a pulled image for the step; pulls once more when
/// `berth gc` removed it in between.
pub fn hold(
    ctx: &StepContext,
    image: &RequestedImage,
    mut stored: StoredImage,
    mut lookup: Option<Lookup>,
) -> anyhow::Result<HeldImage> {
    let store = ctx.store.as_path();
    if stored.manifest_digest.is_none() {
        // a squashfs file given by path, not in the store
        return Ok(HeldImage {
            stored,
            hold: None,
            lookup,
        });
    }
    let open = || with_root(|| Store::open_unswept(store));
    let hold = match with_root(|| open()?.hold(&stored)) {
        Ok(hold) => hold,
        Err(_) => {
            (stored, lookup) = pull(ctx, image)?;
            with_root(|| open()?.hold(&stored))?
        }
    };
    Ok(HeldImage {
        stored,
        hold: Some(hold),
        lookup,
    })
}

/// Gets `image` for the step: a squashfs file given by path is checked with
/// the user's own permissions; a registry image is pulled into the node
/// store as the pull user with the user's credentials ([`crate::puller`]).
/// Called with the user's effective ids (`user_init`).
pub fn pull(
    ctx: &StepContext,
    image: &RequestedImage,
) -> anyhow::Result<(StoredImage, Option<Lookup>)> {
    match run_pull(ctx, image, false)? {
        (Answer::Stored(stored), lookup) => Ok((*stored, lookup)),
        (Answer::NotInStore(digest), _) => Err(anyhow!(
            "the berth helper did not pull '{image}' ({digest}) into the store"
        )),
    }
}

/// A squashfs file the user gave by path, opened with the user's identity
/// (also where slurmstepd runs this as root: a named container),
/// non-blocking, and checked on the descriptor (a regular file: a FIFO or
/// a device fails at once). Refused when it lies in the node store (whose
/// images only the registry's access check hands out): by the path as
/// written, and by the path the opened file resolved to. Then re-packed
/// into the store by the pull user ([`crate::puller::import_file`]): the
/// step mounts the store's copy, never the user's file.
fn user_squashfs(ctx: &StepContext, path: &Path) -> anyhow::Result<StoredImage> {
    let (config, store, user) = (ctx.config, ctx.store.as_path(), &ctx.user);
    let canonical_store = with_root(|| std::fs::canonicalize(store)).ok();
    let in_store = |p: &Path| {
        let p = lexically_normal(p);
        p.starts_with(store) || canonical_store.as_ref().is_some_and(|c| p.starts_with(c))
    };
    let refused = || {
        format!(
            "--container-image={}: the file is inside the node's image store {}, whose \
             images are handed out only by reference (the registry decides who may read \
             them): give the image's reference (e.g. docker://REGISTRY#REPO:TAG) instead",
            path.display(),
            store.display()
        )
    };
    if in_store(path) {
        return Err(anyhow::Error::msg(refused()));
    }
    let mut file = crate::container::loopdev::open_as(path, user)
        .map_err(|e| anyhow!("cannot open squashfs image {}: {e:#}", path.display()))?;
    let checked = Store::squashfs_file_from(path, &mut file)?;
    if in_store(&checked.squashfs) {
        return Err(anyhow::Error::msg(refused()));
    }
    // The kernel never parses the user's bytes: the pull user re-packs them
    // into the store (once per content), and the step mounts that copy.
    let request = crate::puller::ImportRequest {
        helper: &config.helper_path,
        store,
        pull_user: &config.pull_user,
        name: path,
        max_image_size: config.max_image_size,
        shared: PullSettings::from_config(config).shared,
    };
    let node = host_name();
    let show = |line: &str| ctx.report.user(&format!("{node}: {line}"));
    crate::puller::import_file(&request, &file, &show)
}

/// An image of a local container engine, saved as the user and converted
/// by the pull user ([`crate::puller::import_daemon`]).
fn daemon_image(
    ctx: &StepContext,
    source: &crate::reference::DaemonImage,
) -> anyhow::Result<StoredImage> {
    let config = ctx.config;
    let name = PathBuf::from(source.to_string());
    let request = crate::puller::ImportRequest {
        helper: &config.helper_path,
        store: &ctx.store,
        pull_user: &config.pull_user,
        name: &name,
        max_image_size: config.max_image_size,
        shared: PullSettings::from_config(config).shared,
    };
    let node = host_name();
    let show = |line: &str| ctx.report.user(&format!("{node}: {line}"));
    crate::puller::import_daemon(&request, source, &ctx.requester(), &show)
}

/// `path` without `.` and `..` components (taken lexically; `/..` is `/`).
fn lexically_normal(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// [`pull`]; with `cached_only`, only looks in the store (after asking the
/// registry for the manifest, as every pull does). Also returns the time of
/// the registry lookup, when the pull helper reported one.
pub fn run_pull(
    ctx: &StepContext,
    image: &RequestedImage,
    cached_only: bool,
) -> anyhow::Result<(Answer, Option<Lookup>)> {
    let (config, store) = (ctx.config, ctx.store.as_path());
    let reference = match &image.value {
        ImageSource::SquashfsFile(path) => {
            return user_squashfs(ctx, path).map(|stored| (Answer::Stored(Box::new(stored)), None))
        }
        ImageSource::Daemon(source) => {
            return daemon_image(ctx, source).map(|stored| (Answer::Stored(Box::new(stored)), None))
        }
        ImageSource::Registry(reference) => reference,
    };
    let started = std::time::Instant::now();
    if let Some(stored) = in_store_without_registry(ctx, reference) {
        return Ok((
            Answer::Stored(Box::new(stored)),
            Some(Lookup::NodeStore(started.elapsed())),
        ));
    }
    let node = host_name();
    // Progress lines reach the user while the pull runs (one per node every
    // few seconds), and the final "pulled" line when the image was fetched.
    let show = |line: &str| ctx.report.user(line);
    let request = PullRequest {
        helper: &config.helper_path,
        store,
        image: reference,
        pull_user: &config.pull_user,
        settings: PullSettings::from_config(config),
        progress_lines: true,
        cached_only,
        forward: Some((format!("{node}: {image}"), &show)),
    };
    let pulled = crate::puller::pull(&request, CredentialsFrom::User(&ctx.requester()))?;
    if let Answer::Stored(stored) = &pulled.answer {
        record_grant(ctx, reference, stored);
    }
    super::timings::helper_notes(&pulled.stderr)
        .iter()
        .for_each(|note| ctx.report.user(note));
    Ok((
        pulled.answer,
        super::timings::lookup_from_helper(&pulled.stderr).map(Lookup::Helper),
    ))
}

/// An image pinned by digest that the node store holds and that this
/// step may have with no registry request: a public one, or one whose
/// access the pull helper checked for this job on this node already
/// ([`Grants`]). Handed out by slurmstepd itself, with no helper process
/// ([`Store::find_pinned_without_registry`]). Anything else (a private
/// image not yet checked, a tag, an unreadable store entry or grant) goes
/// to the pull helper, which checks access and reports errors.
fn in_store_without_registry(ctx: &StepContext, reference: &ImageRef) -> Option<StoredImage> {
    reference.digest.as_ref()?;
    let grants = Grants::new(&ctx.config.runtime_dir, &ctx.node);
    let granted = |digest: &crate::registry::Digest| {
        grants
            .holds(ctx.job, ctx.user.uid, reference, digest.as_str())
            .unwrap_or(false)
    };
    with_root(|| {
        Store::open_existing(&ctx.store)?
            .find_pinned_without_registry(reference, granted)
            .ok()
            .flatten()
    })
}

/// After the pull helper handed the job's user `stored` under `reference`'s
/// name, remembers it for the job's later steps on this node (best effort:
/// without the grant they ask the registry again).
fn record_grant(ctx: &StepContext, reference: &ImageRef, stored: &StoredImage) {
    let Some(digest) = stored.manifest_digest.as_deref() else {
        return;
    };
    let grants = Grants::new(&ctx.config.runtime_dir, &ctx.node);
    let _ = with_root(|| grants.record(ctx.job, ctx.user.uid, reference, digest));
}

/// The host's name as the pull's messages show it (the full name, as
/// `gethostname` gives it).
fn host_name() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalized_lexically() {
        assert_eq!(
            lexically_normal(Path::new("/a/./b/../c")),
            Path::new("/a/c")
        );
        assert_eq!(lexically_normal(Path::new("/../x")), Path::new("/x"));
    }
}
