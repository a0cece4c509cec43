//! NVIDIA GPUs: which GPUs a container gets, and the device nodes, driver
//! libraries and tools that come with them.
//!
//! The GPUs are the step's (`SLURM_STEP_GPUS`, or `SLURM_JOB_GPUS` for a
//! batch step: Slurm's own variables, never a `CUDA_VISIBLE_DEVICES` the
//! user may have brought from a login node) or those `berth run --gpus` asks for; the image may narrow
//! them (`NVIDIA_VISIBLE_DEVICES`) or refuse them (`void`, `none`, empty) and
//! chooses the driver capabilities (`NVIDIA_DRIVER_CAPABILITIES`, default
//! `compute,utility`). Device nodes come from the device root (`/dev`, or
//! `gpu_dev_root` for tests), libraries from the host's loader cache or a
//! driver root (`gpu_driver_root`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::profile::host_library;
use super::{HostLibrary, Injection};
use crate::container::injection::ldcache::LdCache;
use crate::container::spec::MountSpec;

/// Driver libraries of the `compute` capability; the first is required.
const COMPUTE_LIBRARIES: &[&str] = &[
    "libcuda.so.1",
    "libcudadebugger.so.1",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so.4",
    "libnvidia-gpucomp.so",
    "libnvidia-opencl.so.1",
];
/// Driver libraries of the `utility` capability; the first is required.
const UTILITY_LIBRARIES: &[&str] = &["libnvidia-ml.so.1", "libnvidia-cfg.so.1"];
/// Tools of the `utility` capability, bound into `/usr/bin`.
const UTILITY_BINARIES: &[&str] = &["nvidia-smi", "nvidia-debugdump"];
/// Control device nodes every GPU container gets (those present).
const CONTROL_DEVICES: &[&str] = &["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps"];
/// Folders of a driver root searched for libraries, in order.
const DRIVER_LIB_DIRS: &[&str] = &[
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "lib64",
    "usr/lib",
    "lib",
];

/// Where the GPUs and the driver are on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSite {
    /// Folder with the `nvidia*` device nodes (`/dev`).
    pub dev_root: PathBuf,
    /// A driver installation root searched before the host's loader cache.
    pub driver_root: Option<PathBuf>,
}

/// What `berth run --gpus` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuRequest {
    /// Every GPU of the node.
    All,
    /// The first N GPUs.
    Count(usize),
    /// These GPU indices.
    List(Vec<u32>),
}

impl GpuRequest {
    /// Parses `all`, a count (`2`) or a list of indices (`0,2`, `list:1`).
    pub fn parse(text: &str) -> Result<GpuRequest, String> {
        let text = text.trim();
        if text == "all" {
            return Ok(GpuRequest::All);
        }
        if let Some(list) = text.strip_prefix("list:") {
            return parse_indices(list).map(GpuRequest::List);
        }
        if text.contains(',') {
            return parse_indices(text).map(GpuRequest::List);
        }
        text.parse::<usize>().map(GpuRequest::Count).map_err(|_| {
            format!("--gpus={text}: use all, a count (2), or GPU indices (0,2 or list:1)")
        })
    }
}

fn parse_indices(text: &str) -> Result<Vec<u32>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>()
                .map_err(|_| format!("'{s}' in '{text}' is not a GPU index"))
        })
        .collect()
}

/// The indices N of the `nvidiaN` device nodes in `dev_root`, sorted.
pub fn node_gpus(dev_root: &Path) -> Vec<u32> {
    let mut found: Vec<u32> = std::fs::read_dir(dev_root)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("nvidia")?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    found.sort_unstable();
    found
}

/// The GPUs `request` picks from the node's `available` ones.
pub fn select(available: &[u32], request: &GpuRequest) -> Result<Vec<u32>, String> {
    match request {
        GpuRequest::All => Ok(available.to_vec()),
        GpuRequest::Count(n) if *n > available.len() => Err(format!(
            "--gpus={n}: this node has {} GPU(s) ({})",
            available.len(),
            describe(available)
        )),
        GpuRequest::Count(n) => Ok(available[..*n].to_vec()),
        GpuRequest::List(list) => {
            if let Some(missing) = list.iter().find(|i| !available.contains(i)) {
                return Err(format!(
                    "--gpus: GPU {missing} does not exist on this node (it has: {})",
                    describe(available)
                ));
            }
            Ok(list.clone())
        }
    }
}

fn describe(gpus: &[u32]) -> String {
    if gpus.is_empty() {
        return "none".to_string();
    }
    gpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The GPUs of a Slurm step from its environment: `SLURM_STEP_GPUS`, else
/// `SLURM_JOB_GPUS` (the batch step), indices of the `nvidiaN` device nodes
/// as gres.conf lists them; `None` when the step has no GPUs.
pub fn step_gpus<'a>(mut getenv: impl FnMut(&str) -> Option<&'a str>) -> Option<Vec<u32>> {
    for name in ["SLURM_STEP_GPUS", "SLURM_JOB_GPUS"] {
        if let Some(value) = getenv(name) {
            if let Ok(list) = parse_indices(value) {
                if !list.is_empty() {
                    return Some(list);
                }
            }
        }
    }
    None
}

/// Driver capabilities the container gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// CUDA: libcuda and the JIT compilers.
    pub compute: bool,
    /// NVML and `nvidia-smi`.
    pub utility: bool,
}

/// What the image says (its `NVIDIA_VISIBLE_DEVICES` and
/// `NVIDIA_DRIVER_CAPABILITIES`) about the GPUs `given` to it: the GPUs it
/// gets (empty: no GPU support at all) and the capabilities.
pub fn image_filter(image_env: &[String], given: &[u32]) -> (Vec<u32>, Capabilities) {
    let get = |name: &str| {
        image_env
            .iter()
            .rev()
            .find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
    };
    let gpus = match get("NVIDIA_VISIBLE_DEVICES").map(str::trim) {
        None | Some("all") => given.to_vec(),
        Some("void" | "none" | "") => Vec::new(),
        Some(list) => match parse_indices(list) {
            // Indices into the GPUs given, as CUDA numbers them.
            Ok(indices) => indices
                .iter()
                .filter_map(|&i| given.get(i as usize).copied())
                .collect(),
            Err(_) => given.to_vec(), // UUIDs: keep what Slurm gave
        },
    };
    let mut caps = Capabilities::default();
    for cap in get("NVIDIA_DRIVER_CAPABILITIES")
        .unwrap_or("compute,utility")
        .split(',')
        .map(str::trim)
    {
        match cap {
            "all" => {
                caps.compute = true;
                caps.utility = true;
            }
            "compute" => caps.compute = true,
            "utility" => caps.utility = true,
            _ => {} // graphics, video, display: not injected
        }
    }
    (gpus, caps)
}

/// The injection for `gpus` on `site`; `host_dev` is the `/dev` the container
/// would otherwise get whole (its other `nvidiaN` nodes are hidden).
pub fn injection(
    site: &GpuSite,
    host_dev: &Path,
    gpus: &[u32],
    caps: Capabilities,
    host_cache: &LdCache,
) -> anyhow::Result<Injection> {
    let mut injection = Injection {
        summary: vec![format!("GPUs {}", describe(gpus))],
        ..Injection::default()
    };
    if gpus.is_empty() {
        return Ok(injection);
    }
    for gpu in gpus {
        let source = site.dev_root.join(format!("nvidia{gpu}"));
        if !source.exists() {
            bail!(
                "GPU {gpu} was given to this step but {} does not exist: is the NVIDIA driver \
                 loaded (nvidia-modprobe)?",
                source.display()
            );
        }
        injection.devices.push(MountSpec {
            source,
            target: PathBuf::from(format!("/dev/nvidia{gpu}")),
            read_only: false,
        });
    }
    for name in CONTROL_DEVICES {
        let source = site.dev_root.join(name);
        if source.exists() {
            injection.devices.push(MountSpec {
                source,
                target: Path::new("/dev").join(name),
                read_only: false,
            });
        }
    }
    injection.hidden_devices = node_gpus(host_dev)
        .into_iter()
        .filter(|i| !gpus.contains(i))
        .map(|i| PathBuf::from(format!("/dev/nvidia{i}")))
        .collect();
    let mut wanted: Vec<(&str, bool)> = Vec::new();
    if caps.compute {
        wanted.extend(
            COMPUTE_LIBRARIES
                .iter()
                .enumerate()
                .map(|(i, n)| (*n, i == 0)),
        );
    }
    if caps.utility {
        wanted.extend(
            UTILITY_LIBRARIES
                .iter()
                .enumerate()
                .map(|(i, n)| (*n, i == 0)),
        );
    }
    for (soname, required) in wanted {
        match driver_library(site, soname, host_cache)? {
            Some(library) => injection.libraries.push(library),
            None if required => bail!(
                "the NVIDIA driver library {soname} is neither in {} nor in the host's loader \
                 cache: install the driver's user-space libraries, or set gpu_driver_root",
                site.driver_root
                    .as_deref()
                    .unwrap_or(Path::new("(no gpu_driver_root)"))
                    .display()
            ),
            None => {}
        }
    }
    if caps.utility {
        for name in UTILITY_BINARIES {
            if let Some(path) = driver_binary(site, name) {
                injection.files.push(MountSpec {
                    source: path,
                    target: Path::new("/usr/bin").join(name),
                    read_only: true,
                });
            }
        }
    }
    Ok(injection)
}

/// A driver library by soname: in the driver root (a file named like the
/// soname, or the soname followed by a version), else the host's cache.
fn driver_library(
    site: &GpuSite,
    soname: &str,
    host_cache: &LdCache,
) -> anyhow::Result<Option<HostLibrary>> {
    let origin = "NVIDIA driver";
    if let Some(root) = &site.driver_root {
        for dir in DRIVER_LIB_DIRS.iter().map(|d| root.join(d)) {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut names: Vec<String> = entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n == soname || n.starts_with(&format!("{soname}.")))
                .collect();
            names.sort();
            if let Some(name) = names.first() {
                let path = dir.join(name);
                let real = std::fs::canonicalize(&path)
                    .with_context(|| format!("{origin}: cannot resolve {}", path.display()))?;
                let soname = if soname.ends_with(".so") {
                    name.clone() // versioned soname (libnvidia-gpucomp.so.550.54)
                } else {
                    soname.to_string()
                };
                return Ok(Some(HostLibrary {
                    soname,
                    host_path: real,
                    abi: None,
                    origin: origin.to_string(),
                }));
            }
        }
        return Ok(None);
    }
    if soname.ends_with(".so") {
        let entry = host_cache
            .entries()
            .iter()
            .find(|e| e.soname.starts_with(&format!("{soname}.")));
        return match entry {
            Some(e) => host_library(&e.soname, host_cache, origin).map(Some),
            None => Ok(None),
        };
    }
    match host_cache.lookup(soname) {
        Some(_) => host_library(soname, host_cache, origin).map(Some),
        None => Ok(None),
    }
}

/// A driver tool: in the driver root's `usr/bin` or `bin`, else the host's.
fn driver_binary(site: &GpuSite, name: &str) -> Option<PathBuf> {
    let root = site.driver_root.as_deref().unwrap_or(Path::new("/"));
    ["usr/bin", "bin"]
        .iter()
        .map(|dir| root.join(dir).join(name))
        .find(|path| path.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_requests() {
        assert_eq!(GpuRequest::parse("all"), Ok(GpuRequest::All));
        assert_eq!(GpuRequest::parse("2"), Ok(GpuRequest::Count(2)));
        assert_eq!(GpuRequest::parse("0,3"), Ok(GpuRequest::List(vec![0, 3])));
        assert_eq!(GpuRequest::parse("list:1"), Ok(GpuRequest::List(vec![1])));
        assert!(GpuRequest::parse("many")
            .unwrap_err()
            .contains("use all, a count"));
    }

    #[test]
    fn selects_from_the_node() {
        let node = [0, 1, 2, 3];
        assert_eq!(select(&node, &GpuRequest::All).unwrap(), node);
        assert_eq!(select(&node, &GpuRequest::Count(2)).unwrap(), [0, 1]);
        assert!(select(&node, &GpuRequest::Count(5))
            .unwrap_err()
            .contains("has 4 GPU(s)"));
        assert_eq!(select(&node, &GpuRequest::List(vec![3])).unwrap(), [3]);
        assert!(select(&node, &GpuRequest::List(vec![7]))
            .unwrap_err()
            .contains("GPU 7 does not exist"));
    }

    #[test]
    fn step_gpus_prefer_slurm_step_gpus() {
        let env = [("SLURM_STEP_GPUS", "2,3"), ("SLURM_JOB_GPUS", "0,1,2,3")];
        let get = |n: &str| env.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        assert_eq!(step_gpus(get), Some(vec![2, 3]));
        let batch = |n: &str| (n == "SLURM_JOB_GPUS").then_some("1");
        assert_eq!(step_gpus(batch), Some(vec![1]));
        // A CUDA_VISIBLE_DEVICES from the login node is not the step's.
        let stray = |n: &str| (n == "CUDA_VISIBLE_DEVICES").then_some("0");
        assert_eq!(step_gpus(stray), None);
        assert_eq!(step_gpus(|_| None), None);
        assert_eq!(step_gpus(|_| Some("NoDevFiles")), None);
    }

    #[test]
    fn image_env_narrows_or_refuses() {
        let env = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (gpus, caps) = image_filter(&env(&[]), &[2, 3]);
        assert_eq!(gpus, [2, 3]);
        assert!(caps.compute && caps.utility);
        for refusal in ["void", "none", ""] {
            let e = env(&[&format!("NVIDIA_VISIBLE_DEVICES={refusal}")]);
            assert!(image_filter(&e, &[2, 3]).0.is_empty(), "{refusal}");
        }
        let e = env(&[
            "NVIDIA_VISIBLE_DEVICES=1",
            "NVIDIA_DRIVER_CAPABILITIES=utility",
        ]);
        let (gpus, caps) = image_filter(&e, &[2, 3]);
        assert_eq!(gpus, [3]);
        assert_eq!(
            caps,
            Capabilities {
                compute: false,
                utility: true
            }
        );
    }

    #[test]
    fn injection_from_fake_dev_and_driver_roots() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("dev");
        std::fs::create_dir(&dev).unwrap();
        for name in ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"] {
            std::fs::write(dev.join(name), "").unwrap();
        }
        let lib = dir.path().join("driver/usr/lib64");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libcuda.so.550.1"), "").unwrap();
        std::os::unix::fs::symlink("libcuda.so.550.1", lib.join("libcuda.so.1")).unwrap();
        std::fs::write(lib.join("libnvidia-ml.so.1"), "").unwrap();
        std::fs::write(lib.join("libnvidia-gpucomp.so.550.1"), "").unwrap();
        let bin = dir.path().join("driver/usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("nvidia-smi"), "").unwrap();
        let site = GpuSite {
            dev_root: dev.clone(),
            driver_root: Some(dir.path().join("driver")),
        };
        let caps = Capabilities {
            compute: true,
            utility: true,
        };
        let inj = injection(&site, &dev, &[1], caps, &LdCache::default()).unwrap();
        let targets: Vec<_> = inj.devices.iter().map(|d| d.target.clone()).collect();
        assert_eq!(
            targets,
            ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"].map(PathBuf::from)
        );
        assert_eq!(inj.hidden_devices, [PathBuf::from("/dev/nvidia0")]);
        let libs: Vec<_> = inj.libraries.iter().map(|l| l.soname.as_str()).collect();
        assert_eq!(
            libs,
            [
                "libcuda.so.1",
                "libnvidia-gpucomp.so.550.1",
                "libnvidia-ml.so.1"
            ]
        );
        assert_eq!(inj.libraries[0].host_path, lib.join("libcuda.so.550.1"));
        assert_eq!(inj.files[0].target, Path::new("/usr/bin/nvidia-smi"));
        std::fs::remove_file(lib.join("libcuda.so.1")).unwrap();
        let err = injection(&site, &dev, &[1], caps, &LdCache::default()).unwrap_err();
        assert!(err.to_string().contains("libcuda.so.1 is neither"), "{err}");
        let err = injection(&site, &dev, &[5], caps, &LdCache::default()).unwrap_err();
        assert!(err.to_string().contains("GPU 5 was given"), "{err}");
    }
}
