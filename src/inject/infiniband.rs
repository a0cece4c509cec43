//! The InfiniBand (RDMA) devices a container sees, as `MELLANOX_VISIBLE_DEVICES`
//! asks: the function of enroot's bundled `99-mellanox.sh` hook, built in.
//!
//! Only a list of indices (`0`, `1,3`) changes anything: the container then
//! sees those devices alone. Unset, empty, `void`, `none` and `all` keep the
//! host's view (every HCA, as the host's `/sys` and `/dev` show them): for
//! the first four enroot's hook does nothing either, and `all` shows what
//! the host shows, so nothing is planned for any of them.
//!
//! The indices count the node's verbs devices (every
//! `class/infiniband_verbs/uverbs*` of sysfs, whatever the provider: mlx4,
//! mlx5, soft-RoCE, ...) in the order of their device's real sysfs path, then
//! of their name; for Mellanox HCAs this is enroot's order (the PCI paths).
//!
//! For a list, the container gets empty folders (tmpfs) over
//! `/sys/class/infiniband`, `infiniband_verbs`, `infiniband_mad` and
//! `infiniband_cm` (those the node has), each with its host `abi_version`
//! bound back read-only, and links back to the real sysfs entries of the
//! devices given; libibverbs finds devices through
//! `/sys/class/infiniband_verbs`, so this is what restricts them. In
//! `/dev/infiniband`, the nodes of the other devices are hidden
//! (`rdma_cm` stays). The management entries (`umadN`, `issmN`) are given
//! only to a container whose user is root (remap-root), as enroot does.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::container::injection::{Injection, SysLink, SysMask};
use crate::container::spec::MountSpec;

/// The variable that names the devices.
pub const VARIABLE: &str = "MELLANOX_VISIBLE_DEVICES";

/// The node's sysfs, in production.
pub const SYSFS: &str = "/sys";

/// The sysfs classes a list masks, each where the node has it (a class the
/// node lacks, often `infiniband_cm`, has nothing to hide).
const CLASSES: &[&str] = &[
    "infiniband",
    "infiniband_verbs",
    "infiniband_mad",
    "infiniband_cm",
];

/// Largest sysfs attribute file we read (`ibdev`, `uevent`).
const ATTRIBUTE_LIMIT: u64 = 4096;

/// One entry of a sysfs class that stands for a device node
/// (`infiniband_verbs/uverbs0`, `infiniband_mad/umad0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassEntry {
    /// Its name in the class folder (`uverbs0`).
    pub name: String,
    /// Where its class link leads, as the container names it
    /// (`/sys/devices/pci0000:00/.../infiniband_verbs/uverbs0`).
    pub real_path: PathBuf,
    /// Its device node (`/dev/infiniband/uverbs0`, from `DEVNAME` of its
    /// `uevent`).
    pub node: PathBuf,
}

/// One RDMA device of the node, as its verbs entry in sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbDevice {
    /// The device's name (`mlx5_0`, the `ibdev` file of its verbs entry).
    pub ibdev: String,
    /// The real path of the device (its `device` link resolved), the order.
    pub device_path: PathBuf,
    /// Its verbs entry (`uverbs0`).
    pub verbs: ClassEntry,
    /// Where `/sys/class/infiniband/<ibdev>` leads, as the container names
    /// it; `None` when the node has no such entry.
    pub ib_path: Option<PathBuf>,
    /// Its management entries (`umad0`, `issm0`: one pair per port).
    pub mad: Vec<ClassEntry>,
}

/// Decides what the container gets for `value` of [`VARIABLE`] (`None`:
/// unset) on the node whose sysfs is at `sysfs`; `root_inside`: whether the
/// container's user is root (it gets the management devices too).
///
/// Unset, empty, `void`, `none` and `all` give nothing: the host's view
/// stays (see the module doc). A list needs the node's devices, and fails
/// on an index that is not a number or that the node lacks.
pub fn injection(
    sysfs: &Path,
    value: Option<&str>,
    root_inside: bool,
) -> anyhow::Result<Injection> {
    let Some(value) = value.map(str::trim) else {
        return Ok(Injection::default());
    };
    if matches!(value, "" | "void" | "none" | "all") {
        return Ok(Injection::default());
    }
    let devices = node_devices(sysfs)?;
    let chosen = parse_indices(value, devices.len())?;
    Ok(plan(sysfs, &devices, &chosen, root_inside))
}

/// The node's verbs devices under `sysfs`, in index order (see the module
/// doc); none when the node has no `class/infiniband_verbs`.
pub fn node_devices(sysfs: &Path) -> anyhow::Result<Vec<IbDevice>> {
    let real_sysfs = std::fs::canonicalize(sysfs)
        .with_context(|| format!("cannot resolve {}", sysfs.display()))?;
    let class = sysfs.join("class");
    let mad_entries = class_entries(&class.join("infiniband_mad"), &real_sysfs)?;
    let mut devices = Vec::new();
    for (entry, ibdev) in class_entries(&class.join("infiniband_verbs"), &real_sysfs)? {
        let folder = class.join("infiniband_verbs").join(&entry.name);
        let device_path = match std::fs::canonicalize(folder.join("device")) {
            Ok(path) => path,
            // A device without a parent: its own place stands for it.
            Err(_) => std::fs::canonicalize(&folder)
                .with_context(|| format!("cannot resolve {}", folder.display()))?
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default(),
        };
        let ib_link = class.join("infiniband").join(&ibdev);
        let ib_path = match std::fs::canonicalize(&ib_link) {
            Ok(real) => Some(as_container_path(&real, &real_sysfs, &ib_link)?),
            Err(_) => None,
        };
        let mad = mad_entries
            .iter()
            .filter(|(_, of)| *of == ibdev)
            .map(|(entry, _)| entry.clone())
            .collect();
        devices.push(IbDevice {
            ibdev,
            device_path,
            verbs: entry,
            ib_path,
            mad,
        });
    }
    devices.sort_by(|a, b| {
        (&a.device_path, name_key(&a.verbs.name)).cmp(&(&b.device_path, name_key(&b.verbs.name)))
    });
    Ok(devices)
}

/// The device entries of the class folder `folder` (all but `abi_version`),
/// each with the device it belongs to (its `ibdev` file), by name; none
/// when the folder does not exist.
fn class_entries(folder: &Path, real_sysfs: &Path) -> anyhow::Result<Vec<(ClassEntry, String)>> {
    let listing = match std::fs::read_dir(folder) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", folder.display())),
    };
    let mut entries = Vec::new();
    for item in listing {
        let item = item.with_context(|| format!("cannot list {}", folder.display()))?;
        let name = item.file_name().to_string_lossy().into_owned();
        if name == "abi_version" {
            continue;
        }
        let path = item.path();
        let ibdev = read_attribute(&path.join("ibdev"))?;
        let real = std::fs::canonicalize(&path)
            .with_context(|| format!("cannot resolve {}", path.display()))?;
        let devname = match read_attribute(&path.join("uevent")) {
            Ok(uevent) => uevent
                .lines()
                .find_map(|line| line.strip_prefix("DEVNAME="))
                .map(str::to_string),
            Err(_) => None,
        };
        let node = Path::new("/dev").join(devname.unwrap_or_else(|| format!("infiniband/{name}")));
        entries.push((
            ClassEntry {
                real_path: as_container_path(&real, real_sysfs, &path)?,
                name,
                node,
            },
            ibdev,
        ));
    }
    entries.sort_by(|(a, _), (b, _)| name_key(&a.name).cmp(&name_key(&b.name)));
    Ok(entries)
}

/// The trimmed text of the sysfs attribute at `path`.
fn read_attribute(path: &Path) -> anyhow::Result<String> {
    use std::io::Read;
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut text = String::new();
    file.take(ATTRIBUTE_LIMIT)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(text.trim().to_string())
}

/// `real` (a resolved path under `real_sysfs`) as the container names it,
/// under `/sys`; `what` for the message.
fn as_container_path(real: &Path, real_sysfs: &Path, what: &Path) -> anyhow::Result<PathBuf> {
    let inside = real.strip_prefix(real_sysfs).with_context(|| {
        format!(
            "{} leads to {}, outside {}",
            what.display(),
            real.display(),
            real_sysfs.display()
        )
    })?;
    Ok(Path::new(SYSFS).join(inside))
}

/// Orders `uverbs2` before `uverbs10`: the name without its trailing
/// number, then the number.
fn name_key(name: &str) -> (&str, u64) {
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    (stem, name[stem.len()..].parse().unwrap_or(0))
}

/// The indices of the comma-separated `value`, checked against the node's
/// `count` devices, without repeats, in the order given.
fn parse_indices(value: &str, count: usize) -> anyhow::Result<Vec<usize>> {
    let mut chosen = Vec::new();
    for item in value.split(',').map(str::trim) {
        let index: usize = match item.parse() {
            Ok(index) => index,
            Err(_) => bail!(
                "{VARIABLE}={value}: '{item}' is not a device index; {}; give indices such as \
                 0,1, or all or none",
                node_has(count)
            ),
        };
        if index >= count {
            let advice = if count == 0 {
                "unset it or use none"
            } else {
                "ask for fewer or use all"
            };
            bail!("{VARIABLE}={value}: {}; {advice}", node_has(count));
        }
        if !chosen.contains(&index) {
            chosen.push(index);
        }
    }
    Ok(chosen)
}

/// `this node has 2 InfiniBand devices (indices 0 to 1)`.
fn node_has(count: usize) -> String {
    match count {
        0 => "this node has no InfiniBand devices".to_string(),
        1 => "this node has 1 InfiniBand device (index 0)".to_string(),
        n => format!(
            "this node has {n} InfiniBand devices (indices 0 to {})",
            n - 1
        ),
    }
}

/// The injection that shows the `chosen` of `devices` alone (see the module
/// doc).
fn plan(sysfs: &Path, devices: &[IbDevice], chosen: &[usize], root_inside: bool) -> Injection {
    let given: Vec<&IbDevice> = chosen.iter().map(|&i| &devices[i]).collect();
    let mut masks = Vec::new();
    for class in CLASSES {
        let host = sysfs.join("class").join(class);
        if !host.is_dir() {
            continue;
        }
        let folder = Path::new(SYSFS).join("class").join(class);
        let abi = host.join("abi_version");
        let files = if abi.exists() {
            vec![MountSpec {
                source: abi,
                target: folder.join("abi_version"),
                read_only: true,
            }]
        } else {
            Vec::new()
        };
        let links = given
            .iter()
            .flat_map(|device| class_links(class, device, root_inside))
            .collect();
        masks.push(SysMask {
            folder,
            files,
            links,
        });
    }
    let shown: BTreeSet<&Path> = given
        .iter()
        .flat_map(|device| {
            let mad = device.mad.iter().filter(|_| root_inside);
            std::iter::once(&device.verbs).chain(mad)
        })
        .map(|entry| entry.node.as_path())
        .collect();
    let hidden_devices = devices
        .iter()
        .flat_map(|device| std::iter::once(&device.verbs).chain(&device.mad))
        .map(|entry| entry.node.clone())
        .filter(|node| !shown.contains(node.as_path()))
        .collect();
    let names: Vec<&str> = given.iter().map(|d| d.ibdev.as_str()).collect();
    Injection {
        sys_masks: masks,
        hidden_devices,
        summary: vec![format!(
            "InfiniBand {} ({VARIABLE}={})",
            names.join(","),
            chosen
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(",")
        )],
        ..Injection::default()
    }
}

/// The links of `device` put back in `class`.
fn class_links(class: &str, device: &IbDevice, root_inside: bool) -> Vec<SysLink> {
    let link = |entry: &ClassEntry| SysLink {
        name: entry.name.clone(),
        points_to: entry.real_path.clone(),
    };
    match class {
        "infiniband" => device
            .ib_path
            .iter()
            .map(|path| SysLink {
                name: device.ibdev.clone(),
                points_to: path.clone(),
            })
            .collect(),
        "infiniband_verbs" => vec![link(&device.verbs)],
        "infiniband_mad" if root_inside => device.mad.iter().map(link).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake sysfs with two mlx5 HCAs (one port each), whose PCI paths
    /// sort the other way than their uverbs names: uverbs0 is on the second
    /// PCI device, so index 0 is `mlx5_1` (uverbs1).
    fn two_hcas() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let bus = "devices/pci0000:00";
        // (PCI function, ibdev, number of its uverbs, umad and issm)
        for (pci, ibdev, n) in [("0000:03:00.0", "mlx5_1", 1), ("0000:81:00.0", "mlx5_0", 0)] {
            let function = root.join(bus).join(pci);
            let verbs = function.join(format!("infiniband_verbs/uverbs{n}"));
            std::fs::create_dir_all(&verbs).unwrap();
            std::fs::write(verbs.join("ibdev"), format!("{ibdev}\n")).unwrap();
            std::fs::write(
                verbs.join("uevent"),
                format!(
                    "MAJOR=231\nMINOR={}\nDEVNAME=infiniband/uverbs{n}\n",
                    192 + n
                ),
            )
            .unwrap();
            symlink(format!("../../../{pci}"), verbs.join("device")).unwrap();
            std::fs::create_dir_all(function.join(format!("infiniband/{ibdev}"))).unwrap();
            for mad in [format!("umad{n}"), format!("issm{n}")] {
                let entry = function.join("infiniband_mad").join(&mad);
                std::fs::create_dir_all(&entry).unwrap();
                std::fs::write(entry.join("ibdev"), format!("{ibdev}\n")).unwrap();
            }
            for (class, name) in [
                ("infiniband_verbs", format!("uverbs{n}")),
                ("infiniband", ibdev.to_string()),
                ("infiniband_mad", format!("umad{n}")),
                ("infiniband_mad", format!("issm{n}")),
            ] {
                let folder = root.join("class").join(class);
                std::fs::create_dir_all(&folder).unwrap();
                let real = format!("../../{bus}/{pci}/{class}/{name}");
                symlink(real, folder.join(name)).unwrap();
            }
        }
        for class in ["infiniband_verbs", "infiniband_mad"] {
            std::fs::write(root.join("class").join(class).join("abi_version"), "6\n").unwrap();
        }
        dir
    }

    #[test]
    fn devices_are_numbered_by_their_pci_path_and_mapped_to_their_entries() {
        let sysfs = two_hcas();
        let devices = node_devices(sysfs.path()).unwrap();
        let names: Vec<(&str, &str)> = devices
            .iter()
            .map(|d| (d.verbs.name.as_str(), d.ibdev.as_str()))
            .collect();
        assert_eq!(names, vec![("uverbs1", "mlx5_1"), ("uverbs0", "mlx5_0")]);
        let first = &devices[0];
        assert_eq!(
            first.verbs.real_path,
            Path::new("/sys/devices/pci0000:00/0000:03:00.0/infiniband_verbs/uverbs1")
        );
        assert_eq!(first.verbs.node, Path::new("/dev/infiniband/uverbs1"));
        assert_eq!(
            first.ib_path.as_deref(),
            Some(Path::new(
                "/sys/devices/pci0000:00/0000:03:00.0/infiniband/mlx5_1"
            ))
        );
        let mad: Vec<&str> = first.mad.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(mad, vec!["issm1", "umad1"]);
        // No uevent: the node is named after the entry.
        assert_eq!(first.mad[1].node, Path::new("/dev/infiniband/umad1"));
    }

    #[test]
    fn a_node_without_verbs_devices_has_none() {
        let sysfs = tempfile::tempdir().unwrap();
        assert!(node_devices(sysfs.path()).unwrap().is_empty());
    }

    #[test]
    fn unset_all_void_and_none_plan_nothing() {
        // Not even the sysfs is read: a missing one would fail.
        let missing = Path::new("/nonexistent/sysfs");
        for value in [None, Some(""), Some("all"), Some("void"), Some("none")] {
            let injection = injection(missing, value, false).unwrap();
            assert_eq!(injection, Injection::default(), "{value:?}");
        }
    }

    #[test]
    fn bad_indices_name_the_variable_the_value_and_the_devices() {
        let sysfs = two_hcas();
        let err = injection(sysfs.path(), Some("3"), false)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "MELLANOX_VISIBLE_DEVICES=3: this node has 2 InfiniBand devices (indices 0 to 1); \
             ask for fewer or use all"
        );
        let err = injection(sysfs.path(), Some("0,mlx5_0"), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("MELLANOX_VISIBLE_DEVICES=0,mlx5_0: 'mlx5_0' is not a device index"),
            "{err}"
        );
        assert!(err.contains("indices 0 to 1"), "{err}");
        for value in ["-1", "1,", ",1"] {
            assert!(
                injection(sysfs.path(), Some(value), false).is_err(),
                "{value}"
            );
        }
        let empty = tempfile::tempdir().unwrap();
        let err = injection(empty.path(), Some("0"), false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("this node has no InfiniBand devices"), "{err}");
    }

    fn links(injection: &Injection, folder: &str) -> Vec<(String, PathBuf)> {
        let mask = injection
            .sys_masks
            .iter()
            .find(|m| m.folder == Path::new(folder))
            .unwrap_or_else(|| panic!("no mask over {folder}"));
        mask.links
            .iter()
            .map(|l| (l.name.clone(), l.points_to.clone()))
            .collect()
    }

    #[test]
    fn one_device_of_two_for_a_user() {
        let sysfs = two_hcas();
        let injection = injection(sysfs.path(), Some("1"), false).unwrap();
        let folders: Vec<&Path> = injection
            .sys_masks
            .iter()
            .map(|m| m.folder.as_path())
            .collect();
        // No infiniband_cm on this node: not masked.
        assert_eq!(
            folders,
            vec![
                Path::new("/sys/class/infiniband"),
                Path::new("/sys/class/infiniband_verbs"),
                Path::new("/sys/class/infiniband_mad"),
            ]
        );
        let abi: Vec<(PathBuf, PathBuf, bool)> = injection
            .sys_masks
            .iter()
            .flat_map(|m| &m.files)
            .map(|f| (f.source.clone(), f.target.clone(), f.read_only))
            .collect();
        assert_eq!(
            abi,
            vec![
                (
                    sysfs.path().join("class/infiniband_verbs/abi_version"),
                    "/sys/class/infiniband_verbs/abi_version".into(),
                    true
                ),
                (
                    sysfs.path().join("class/infiniband_mad/abi_version"),
                    "/sys/class/infiniband_mad/abi_version".into(),
                    true
                ),
            ]
        );
        let device = "/sys/devices/pci0000:00/0000:81:00.0";
        assert_eq!(
            links(&injection, "/sys/class/infiniband"),
            vec![(
                "mlx5_0".into(),
                format!("{device}/infiniband/mlx5_0").into()
            )]
        );
        assert_eq!(
            links(&injection, "/sys/class/infiniband_verbs"),
            vec![(
                "uverbs0".into(),
                format!("{device}/infiniband_verbs/uverbs0").into()
            )]
        );
        assert!(links(&injection, "/sys/class/infiniband_mad").is_empty());
        let mut hidden = injection.hidden_devices.clone();
        hidden.sort();
        let expected: Vec<PathBuf> = ["issm0", "issm1", "umad0", "umad1", "uverbs1"]
            .iter()
            .map(|n| Path::new("/dev/infiniband").join(n))
            .collect();
        assert_eq!(hidden, expected);
        assert!(injection.needs_own_dev());
        assert_eq!(
            injection.summary,
            vec!["InfiniBand mlx5_0 (MELLANOX_VISIBLE_DEVICES=1)"]
        );
    }

    #[test]
    fn a_root_container_also_gets_the_management_entries_of_its_device() {
        let sysfs = two_hcas();
        let injection = injection(sysfs.path(), Some("1"), true).unwrap();
        let device = "/sys/devices/pci0000:00/0000:81:00.0/infiniband_mad";
        assert_eq!(
            links(&injection, "/sys/class/infiniband_mad"),
            vec![
                ("issm0".into(), format!("{device}/issm0").into()),
                ("umad0".into(), format!("{device}/umad0").into()),
            ]
        );
        let mut hidden = injection.hidden_devices.clone();
        hidden.sort();
        let expected: Vec<PathBuf> = ["issm1", "umad1", "uverbs1"]
            .iter()
            .map(|n| Path::new("/dev/infiniband").join(n))
            .collect();
        assert_eq!(hidden, expected);
    }

    #[test]
    fn infiniband_cm_is_masked_when_the_node_has_it() {
        let sysfs = two_hcas();
        let cm = sysfs.path().join("class/infiniband_cm");
        std::fs::create_dir_all(&cm).unwrap();
        std::fs::write(cm.join("abi_version"), "1\n").unwrap();
        let injection = injection(sysfs.path(), Some("0,1,0"), false).unwrap();
        let mask = injection.sys_masks.last().unwrap();
        assert_eq!(mask.folder, Path::new("/sys/class/infiniband_cm"));
        assert_eq!(mask.files.len(), 1);
        assert!(mask.links.is_empty());
        let verbs: Vec<String> = links(&injection, "/sys/class/infiniband_verbs")
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(verbs, vec!["uverbs1", "uverbs0"]);
    }

    #[test]
    fn names_sort_by_their_number() {
        let mut names = vec!["uverbs10", "uverbs2", "uverbs1"];
        names.sort_by_key(|n| name_key(n));
        assert_eq!(names, vec!["uverbs1", "uverbs2", "uverbs10"]);
    }
}
