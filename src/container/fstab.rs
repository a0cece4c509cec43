//! `mounts.d/*.fstab` lines as enroot reads them (its `doc/image-format.md`):
//! `SOURCE TARGET [TYPE [OPTIONS [FREQ [PASSNO]]]]`, the target inside the
//! container, `${NAME}` replaced by the job's value, enroot's options
//! `x-create=dir|file|auto`, `nofail`, `silent` besides mount(8)'s. Each
//! line becomes a [`UserMount`], made like a `--container-mounts` entry (as
//! the user, after the drop, so the kernel checks the user's permissions):
//! binds (`bind`, `rbind`; berth's binds are always recursive) and tmpfs.
//! What berth makes itself (`/proc`, `/sys`, `/dev`, `/tmp`, the `/etc`
//! files of enroot's stock `10-system.fstab` and `20-config.fstab`) is left
//! to berth; other mount types and options are named in a note and the line
//! is left out.

use std::path::PathBuf;

use crate::container::usermount::{apply_flag, MountFlags, MountKind, UserMount};

/// Targets berth mounts itself in every container.
const BERTH_MAKES: &[&str] = &[
    "/proc",
    "/sys",
    "/dev",
    "/dev/shm",
    "/dev/mqueue",
    "/dev/pts",
    "/tmp",
    "/run",
    "/var/run",
    "/var/lock",
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
    "/etc/machine-id",
];

/// What one file's lines give.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    /// The mounts, in file order.
    pub mounts: Vec<UserMount>,
    /// Targets left to berth.
    pub left_to_berth: Vec<String>,
    /// Lines left out, and why.
    pub notes: Vec<String>,
}

/// Reads the fstab `text` (named `source` in notes), `${NAME}` looked up
/// with `lookup` (unknown names become empty, as with enroot), and a
/// `nofail` bind kept only when `exists` says its source is there.
pub fn parse(
    text: &str,
    source: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    exists: &dyn Fn(&std::path::Path) -> bool,
    into: &mut Parsed,
) {
    for (number, raw) in text.lines().enumerate() {
        let line = substitute(raw, lookup);
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match entry(line) {
            Ok(Entry::Mount(mount, nofail)) => {
                if nofail && mount.kind == MountKind::Bind && !exists(&mount.source) {
                    continue;
                }
                into.mounts.push(mount);
            }
            Ok(Entry::Berths(target)) => {
                if !into.left_to_berth.contains(&target) {
                    into.left_to_berth.push(target);
                }
            }
            Err(why) => into
                .notes
                .push(format!("{source}:{}: {why}: left out", number + 1)),
        }
    }
}

enum Entry {
    Mount(UserMount, bool),
    Berths(String),
}

/// One line's mount, and whether it is `nofail`.
fn entry(line: &str) -> Result<Entry, String> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [source, target, rest @ ..] = fields.as_slice() else {
        return Err("no target".into());
    };
    let target = format!("/{}", target.trim_start_matches('/'));
    let target = target.trim_end_matches('/').to_string();
    let target = if target.is_empty() {
        "/".into()
    } else {
        target
    };
    if BERTH_MAKES.contains(&target.as_str()) {
        return Ok(Entry::Berths(target));
    }
    if target.split('/').any(|part| part == "..") {
        return Err(format!("target {target} leaves the container"));
    }
    // Short forms: `SRC DST OPTIONS` (no type) and `tmpfs DST`.
    let (fs_type, options) = match rest {
        [] if *source == "tmpfs" => ("tmpfs", ""),
        [] => ("none", ""),
        [only] if only.contains("bind") => ("none", *only),
        [fs_type] => (*fs_type, ""),
        [fs_type, options, ..] => (*fs_type, *options),
    };
    let options: Vec<&str> = options.split(',').filter(|o| !o.is_empty()).collect();
    let kind = match fs_type {
        "tmpfs" => MountKind::Tmpfs,
        "none" if options.iter().any(|o| matches!(*o, "bind" | "rbind")) => MountKind::Bind,
        "none" => {
            let odd = options
                .iter()
                .find(|o| o.starts_with("x-") && !o.starts_with("x-create="));
            return Err(match odd {
                Some(option) => format!("option {option}"),
                None => "neither bind nor rbind".to_string(),
            });
        }
        other => {
            return Err(format!(
                "mount type {other} (berth makes binds and tmpfs only)"
            ))
        }
    };
    let source = match kind {
        MountKind::Bind if source.starts_with('/') => PathBuf::from(source),
        MountKind::Bind => return Err(format!("source {source} is not an absolute path")),
        _ => PathBuf::from("tmpfs"),
    };
    let mut mount = UserMount {
        kind,
        source,
        target: PathBuf::from(target),
        read_only: false,
        flags: MountFlags::default(),
        tmpfs_options: Vec::new(),
    };
    let mut nofail = false;
    for option in options {
        match option {
            "bind" | "rbind" | "defaults" | "silent" => {}
            "x-create=dir" | "x-create=file" | "x-create=auto" => {}
            "nofail" => nofail = true,
            other if apply_flag(&mut mount, other) => {}
            other => return Err(format!("option {other}")),
        }
    }
    Ok(Entry::Mount(mount, nofail))
}

/// `line` with each `${NAME}` replaced by `lookup(NAME)` (empty when unset).
pub fn substitute(line: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let name = &after[..name_len];
        let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
        if valid && after[name_len..].starts_with('}') {
            out.push_str(&rest[..start]);
            out.push_str(&lookup(name).unwrap_or_default());
            rest = &after[name_len + 1..];
        } else {
            out.push_str(&rest[..start + 2]);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
#[path = "fstab_tests.rs"]
mod tests;
