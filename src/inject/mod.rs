//! What the host adds to a container beyond the image: host MPI and
//! interconnect libraries (site profiles), GPUs and their driver libraries
//! (NVIDIA discovery or CDI specs), InfiniBand devices
//! (`MELLANOX_VISIBLE_DEVICES`), device nodes and environment.
//!
//! Everything is decided before the holder starts, by pure functions over the
//! configuration, the job's request and the image's config, into one
//! [`Injection`] that travels in the container spec; the holder applies it
//! (`container::injection::apply`) as root before the host's `/proc`, `/sys` and `/dev` enter the
//! root, checks MPI ABI compatibility against the image's own libraries, binds
//! the host files and registers the libraries with the image's loader
//! (`ldconfig -r`, run as the job's user, builds `/etc/ld.so.cache` for the
//! container's tmpfs layer;
//! the image itself is never modified).
//!
//! Modules: [`profile`] (site profiles for host MPI and interconnect),
//! [`gpu`] (NVIDIA GPUs and driver libraries), [`cdi`] (Container Device
//! Interface specs), [`infiniband`] (which RDMA devices the container
//! sees). The [`Injection`] itself, the loader's formats
//! ([`ldcache`], [`abi`]) and the holder's side that applies it live in
//! `container::injection`, below this module: the container knows what to
//! apply, never how it was decided.

use std::path::PathBuf;

pub mod cdi;
pub mod gpu;
pub mod infiniband;
pub mod profile;

pub use crate::container::injection::abi::{self, AbiPolicy};
pub use crate::container::injection::ldcache;
pub use crate::container::injection::{HostLibrary, Injection, LIB_DIR};

/// Where berth finds what it injects into containers (the `inject_dir`, `gpu_*` and
/// `cdi_spec_dirs` keys of `crate::config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectConfig {
    /// Folder of the host MPI and interconnect profiles (`inject_dir`).
    pub profile_dir: PathBuf,
    /// Folder with the `nvidia*` device nodes (`gpu_dev_root`).
    pub gpu_dev_root: PathBuf,
    /// NVIDIA driver root searched before the host's loader cache (`gpu_driver_root`).
    pub gpu_driver_root: Option<PathBuf>,
    /// CDI spec folders (`cdi_spec_dirs`, comma-separated).
    pub cdi_spec_dirs: Vec<PathBuf>,
}

impl Default for InjectConfig {
    fn default() -> Self {
        InjectConfig {
            profile_dir: PathBuf::from(profile::DEFAULT_INJECT_DIR),
            gpu_dev_root: PathBuf::from("/dev"),
            gpu_driver_root: None,
            cdi_spec_dirs: cdi::DEFAULT_SPEC_DIRS.iter().map(PathBuf::from).collect(),
        }
    }
}

/// What a job or `berth run` asks to have injected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// `--container-mpi=NAME` (`none`: no profile, not even the image label's).
    pub mpi: Option<String>,
    /// The GPUs given (the Slurm step's, or `berth run --gpus`); `None`: none.
    pub gpus: Option<Vec<u32>>,
    /// CDI devices asked for by name (`vendor.com/class=name`).
    pub cdi_devices: Vec<String>,
    /// The job's `MELLANOX_VISIBLE_DEVICES` (see [`infiniband`]); `None`:
    /// the image's, if it sets one.
    pub mellanox_visible_devices: Option<String>,
    /// Whether the container's user is root (remap-root, or root itself):
    /// it also gets the InfiniBand management devices (`umad`, `issm`).
    pub root_inside: bool,
}

/// The CDI kind whose specs, when present, describe the GPUs instead of
/// berth's own NVIDIA discovery.
pub const GPU_CDI_KIND: &str = "nvidia.com/gpu";

/// Decides everything to inject for `request` into a container of `image` on
/// this node, under the site's `config`.
pub fn resolve(
    config: &InjectConfig,
    request: &Request,
    image: &crate::image::ImageConfig,
) -> anyhow::Result<Injection> {
    // A host without a loader cache can still take profiles of absolute paths.
    let host_cache =
        ldcache::LdCache::read(std::path::Path::new("/etc/ld.so.cache")).unwrap_or_default();
    let mut injection = Injection::default();
    let label = image.labels.get(profile::MPI_LABEL).map(String::as_str);
    for profile in profile::select(&config.profile_dir, request.mpi.as_deref(), label)? {
        injection.extend(profile.resolve(&host_cache)?);
    }
    let wants_devices = request.gpus.is_some() || !request.cdi_devices.is_empty();
    let specs = if wants_devices {
        cdi::load_specs(&config.cdi_spec_dirs)?
    } else {
        Vec::new()
    };
    if let Some(given) = &request.gpus {
        let (gpus, caps) = gpu::image_filter(&image.env, given);
        if !gpus.is_empty() && cdi::has_kind(&specs, GPU_CDI_KIND) {
            let names: Vec<String> = gpus.iter().map(|i| format!("{GPU_CDI_KIND}={i}")).collect();
            let mut from_cdi = cdi::injection(&specs, &names)?;
            from_cdi.hidden_devices = gpu::node_gpus(std::path::Path::new("/dev"))
                .into_iter()
                .filter(|i| !gpus.contains(i))
                .map(|i| PathBuf::from(format!("/dev/nvidia{i}")))
                .collect();
            injection.extend(from_cdi);
        } else if !gpus.is_empty() {
            let site = gpu::GpuSite {
                dev_root: config.gpu_dev_root.clone(),
                driver_root: config.gpu_driver_root.clone(),
            };
            let dev = std::path::Path::new("/dev");
            injection.extend(gpu::injection(&site, dev, &gpus, caps, &host_cache)?);
        }
    }
    if !request.cdi_devices.is_empty() {
        injection.extend(cdi::injection(&specs, &request.cdi_devices)?);
    }
    let sysfs = std::path::Path::new(infiniband::SYSFS);
    injection.extend(infiniband_injection(sysfs, request, image)?);
    let mut seen = std::collections::BTreeSet::new();
    injection
        .libraries
        .retain(|library| seen.insert(library.soname.clone()));
    Ok(injection)
}

/// The InfiniBand part of [`resolve`] on the node whose sysfs is at
/// `sysfs`: the job's `MELLANOX_VISIBLE_DEVICES`, else the image's (its last
/// entry, as the container would see it).
fn infiniband_injection(
    sysfs: &std::path::Path,
    request: &Request,
    image: &crate::image::ImageConfig,
) -> anyhow::Result<Injection> {
    let from_image = || {
        image
            .env
            .iter()
            .rev()
            .find_map(|entry| entry.strip_prefix(infiniband::VARIABLE)?.strip_prefix('='))
    };
    match request.mellanox_visible_devices.as_deref() {
        Some(value) => infiniband::injection(sysfs, Some(value), request.root_inside),
        None => infiniband::injection(sysfs, from_image(), request.root_inside).map_err(|e| {
            e.context(format!(
                "{} comes from the image's environment (or the site's environ.d); set it in the \
                 job's environment to choose other devices",
                infiniband::VARIABLE
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image_setting(value: &str) -> crate::image::ImageConfig {
        crate::image::ImageConfig {
            env: vec![
                "PATH=/usr/bin".into(),
                format!("{}={value}", infiniband::VARIABLE),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn the_job_s_mellanox_visible_devices_wins_over_the_image_s() {
        // A node without InfiniBand: any index fails, `none` plans nothing.
        let sysfs = tempfile::tempdir().unwrap();
        let job = |value: Option<&str>| Request {
            mellanox_visible_devices: value.map(str::to_string),
            ..Request::default()
        };
        let image = image_setting("0");
        let err = infiniband_injection(sysfs.path(), &job(None), &image)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("MELLANOX_VISIBLE_DEVICES comes from the image's environment"),
            "{err}"
        );
        let planned = infiniband_injection(sysfs.path(), &job(Some("none")), &image).unwrap();
        assert!(planned.is_empty());
        let image = image_setting("all");
        let err = infiniband_injection(sysfs.path(), &job(Some("1")), &image).unwrap_err();
        assert_eq!(
            format!("{err:#}"),
            "MELLANOX_VISIBLE_DEVICES=1: this node has no InfiniBand devices; unset it or use none"
        );
        let none = crate::image::ImageConfig::default();
        assert!(infiniband_injection(sysfs.path(), &job(None), &none)
            .unwrap()
            .is_empty());
    }
}
