//! What the host adds to one container beyond the image, as the holder
//! receives it in the spec ([`Injection`]: host libraries, files, devices,
//! environment), the loader's formats it is checked against ([`ldcache`],
//! [`abi`]), and the holder's side that applies it ([`apply`], [`ldconfig`]).
//! What to inject is decided above, in `crate::inject`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::container::usermount::MountSpec;

pub mod abi;
pub mod apply;
pub mod ldcache;
pub mod ldconfig;

use abi::AbiPolicy;

/// Where injected libraries appear inside the container (registered with the
/// image's loader, first in its search order).
pub const LIB_DIR: &str = "/usr/local/lib/berth";

/// One host library to inject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostLibrary {
    /// Soname the loader looks for (`libmpich.so.12`).
    pub soname: String,
    /// The host's real file (symlinks resolved), bound read-only.
    pub host_path: PathBuf,
    /// Check MPI ABI compatibility against the image's copy of the same
    /// soname before replacing it (MPI libraries of a profile).
    #[serde(default)]
    pub abi: Option<AbiPolicy>,
    /// Where it came from, for messages (`profile host`, `NVIDIA driver`).
    pub origin: String,
}

/// A host `/sys` folder the container sees only in part
/// (`/sys/class/infiniband_verbs` with some devices left out): an empty tmpfs
/// over it, then some of its host files bound back and some of its links
/// made again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SysMask {
    /// The folder, as the container names it (under `/sys`).
    pub folder: PathBuf,
    /// Host files bound back read-only into it (`abi_version`).
    pub files: Vec<MountSpec>,
    /// Links made again in it.
    pub links: Vec<SysLink>,
}

/// A link of a [`SysMask`] folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SysLink {
    /// Its name in the folder (`uverbs1`).
    pub name: String,
    /// Where it points: the real sysfs path of the entry
    /// (`/sys/devices/pci0000:00/.../infiniband_verbs/uverbs1`).
    pub points_to: PathBuf,
}

/// Everything injected into one container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Injection {
    /// Libraries bound into [`LIB_DIR`] under their soname and over the
    /// image's own copy of the same soname.
    pub libraries: Vec<HostLibrary>,
    /// Other host files and folders (binaries such as `nvidia-smi`, CDI
    /// mounts, site files), bound at their target.
    pub files: Vec<MountSpec>,
    /// Device nodes to add: host node (possibly under another device root)
    /// bound at the target under `/dev`.
    pub devices: Vec<MountSpec>,
    /// Host `/dev` entries left out of the container's `/dev` (the GPUs the
    /// step was not given). When this or `devices` is not empty, the
    /// container gets a `/dev` of its own (a tmpfs with binds of every other
    /// host entry) instead of the host's whole `/dev`.
    pub hidden_devices: Vec<PathBuf>,
    /// Host `/sys` folders shown only in part (the InfiniBand devices not
    /// given), masked once the host's `/sys` is bound.
    #[serde(default)]
    pub sys_masks: Vec<SysMask>,
    /// Environment variables (`NAME=VALUE`) set in the container over the
    /// image's.
    pub env: Vec<String>,
    /// Descriptions of what was injected, for logs (`profile host`, `GPUs 0,1`).
    pub summary: Vec<String>,
}

impl Injection {
    /// Whether there is nothing to inject.
    pub fn is_empty(&self) -> bool {
        self.libraries.is_empty()
            && self.files.is_empty()
            && self.devices.is_empty()
            && self.hidden_devices.is_empty()
            && self.sys_masks.is_empty()
            && self.env.is_empty()
    }

    /// Whether the container needs a `/dev` of its own.
    pub fn needs_own_dev(&self) -> bool {
        !self.devices.is_empty() || !self.hidden_devices.is_empty()
    }

    /// Adds everything of `other` to this injection.
    pub fn extend(&mut self, other: Injection) {
        self.libraries.extend(other.libraries);
        self.files.extend(other.files);
        self.devices.extend(other.devices);
        self.hidden_devices.extend(other.hidden_devices);
        self.sys_masks.extend(other.sys_masks);
        self.env.extend(other.env);
        self.summary.extend(other.summary);
    }
}
