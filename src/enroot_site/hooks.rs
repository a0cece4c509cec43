//! `hooks.d/*.sh`: the site's pre-start hooks, in name order, as enroot
//! runs them (executable files only). enroot's own bundled hooks are left
//! out by name: berth does their work itself, or does not support it yet;
//! either way running enroot's script (written for root and enroot's
//! library) would only fail the step.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// enroot's bundled hooks whose work berth does itself.
const BUILT_IN: &[&str] = &[
    LOCALTIME,
    "10-aptfix.sh",
    "10-cgroups.sh",
    "10-devices.sh",
    "10-home.sh",
    "10-shadow.sh",
    MIG_CONFIG,
    SHARP,
    "50-slurm-pmi.sh",
    "50-slurm-pytorch.sh",
    "98-nvidia.sh",
    // MELLANOX_VISIBLE_DEVICES: crate::inject::infiniband.
    "99-mellanox.sh",
];

/// enroot's bundled hooks berth does not run and does not replace yet.
const NOT_SUPPORTED: &[&str] = &[];

/// enroot's time zone hook: berth gives the container the node's zone
/// ([`super::localtime`]) when a site's `hooks.d` has it.
pub const LOCALTIME: &str = "10-localtime.sh";

/// enroot's SHARP hook: berth sets its variables ([`super::sharp`]) when a
/// site's `hooks.d` has it.
pub const SHARP: &str = "50-sharp.sh";

/// enroot's MIG hook, which asks NVIDIA's container tool for the MIG
/// configuration capability: berth's containers have the host's
/// `/dev/nvidia-caps` and `/proc/driver/nvidia/capabilities` as they are,
/// so that capability is there as far as the host's permissions give it.
pub const MIG_CONFIG: &str = "50-mig-config.sh";

/// The hooks of one `hooks.d` folder.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Listed {
    /// The site's hooks to run, in name order.
    pub scripts: Vec<PathBuf>,
    /// enroot's bundled hooks left out because berth does their work.
    pub built_in: Vec<String>,
    /// enroot's bundled hooks left out that berth does not replace yet.
    pub not_supported: Vec<String>,
}

/// Lists the `.sh` files of `dir` (a folder already found trusted): a
/// hook must be a regular file of root's that no one else can write (not
/// a symlink), and executable, as enroot runs only those; other files are
/// named in `notes`.
pub fn list(dir: &Path, notes: &mut Vec<String>) -> Listed {
    let mut listed = Listed::default();
    for path in crate::root_files::listed(dir, ".sh") {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if BUILT_IN.contains(&name.as_str()) {
            listed.built_in.push(name);
            continue;
        }
        if NOT_SUPPORTED.contains(&name.as_str()) {
            listed.not_supported.push(name);
            continue;
        }
        match std::fs::symlink_metadata(&path) {
            Err(e) => notes.push(format!("cannot look at {}: {e}", path.display())),
            Ok(meta) if !meta.is_file() => notes.push(format!(
                "{} is not run: no regular file (a symlink?)",
                path.display()
            )),
            Ok(meta) if meta.uid() != 0 || meta.mode() & 0o022 != 0 => notes.push(format!(
                "{} is not run: it must be root's and writable by root only",
                path.display()
            )),
            Ok(meta) if meta.mode() & 0o111 == 0 => notes.push(format!(
                "{} is not run: not executable (enroot runs only executable hooks)",
                path.display()
            )),
            Ok(_) => listed.scripts.push(path),
        }
    }
    listed
}

impl Listed {
    /// Whether the site's folder has enroot's bundled hook `name`.
    pub fn has_bundled(&self, name: &str) -> bool {
        self.built_in.iter().any(|n| n == name)
    }

    /// One line naming the bundled hooks left out, or `None`.
    pub fn skipped_line(&self) -> Option<String> {
        let mut parts = Vec::new();
        if !self.built_in.is_empty() {
            parts.push(format!(
                "enroot's hooks not run, berth does their work: {}",
                self.built_in.join(", ")
            ));
        }
        if !self.not_supported.is_empty() {
            parts.push(format!(
                "enroot's hooks not run, not supported by berth yet: {}",
                self.not_supported.join(", ")
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}
