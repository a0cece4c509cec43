//! The work of enroot's bundled hook `10-localtime.sh`, done by berth when
//! the site's `hooks.d` has it: where the node's `/etc/localtime` is a link
//! to a zone file, the container gets the node's time zone (the same link,
//! and the zone file where the image lacks it); where it is not a link,
//! nothing changes, as with enroot.

use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context};

use crate::container::spec::HostZone;

/// The node's link, in production.
pub const HOST_LOCALTIME: &str = "/etc/localtime";

/// Largest zone file we copy (real ones are a few KiB).
const ZONE_FILE_LIMIT: u64 = 1 << 20;

/// The zone that `localtime` (the node's `/etc/localtime`) links to;
/// `None` when it is missing or not a link.
pub fn host_zone(localtime: &Path) -> anyhow::Result<Option<HostZone>> {
    match std::fs::symlink_metadata(localtime) {
        Ok(meta) if meta.file_type().is_symlink() => {}
        _ => return Ok(None),
    }
    let zone_file = std::fs::canonicalize(localtime).with_context(|| {
        format!(
            "the node's {} links to a missing zone file (enroot's 10-localtime.sh is in hooks.d): \
             fix the link or remove the hook",
            localtime.display()
        )
    })?;
    let file = std::fs::File::open(&zone_file)
        .with_context(|| format!("cannot open the node's zone file {}", zone_file.display()))?;
    if !file.metadata()?.is_file() {
        bail!(
            "the node's zone file {} is not a regular file",
            zone_file.display()
        );
    }
    let mut contents = Vec::new();
    file.take(ZONE_FILE_LIMIT + 1)
        .read_to_end(&mut contents)
        .with_context(|| format!("cannot read the node's zone file {}", zone_file.display()))?;
    if contents.len() as u64 > ZONE_FILE_LIMIT {
        bail!(
            "the node's zone file {} is larger than {ZONE_FILE_LIMIT} bytes",
            zone_file.display()
        );
    }
    Ok(Some(HostZone {
        zone_file,
        contents,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_gives_its_zone_file_and_contents() {
        let dir = tempfile::tempdir().unwrap();
        let zone = dir.path().join("zoneinfo/Europe/Berlin");
        std::fs::create_dir_all(zone.parent().unwrap()).unwrap();
        std::fs::write(&zone, b"TZif2 berlin").unwrap();
        let link = dir.path().join("localtime");
        std::os::unix::fs::symlink("zoneinfo/Europe/Berlin", &link).unwrap();
        let found = host_zone(&link).unwrap().unwrap();
        assert_eq!(found.zone_file, std::fs::canonicalize(&zone).unwrap());
        assert_eq!(found.contents, b"TZif2 berlin");
    }

    #[test]
    fn a_plain_file_or_none_changes_nothing_and_a_dangling_link_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("localtime");
        std::fs::write(&plain, b"TZif2").unwrap();
        assert_eq!(host_zone(&plain).unwrap(), None);
        assert_eq!(host_zone(&dir.path().join("missing")).unwrap(), None);
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink("zoneinfo/Nowhere", &dangling).unwrap();
        let err = format!("{:#}", host_zone(&dangling).unwrap_err());
        assert!(err.contains("links to a missing zone file"), "{err}");
    }
}
