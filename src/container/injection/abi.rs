//! MPI ABI checks before host MPI libraries replace a container's.
//!
//! The MPICH ABI Compatibility Initiative (MPICH, Intel MPI, Cray MPT,
//! MVAPICH) keeps soname major 12 (`libmpi.so.12`, Debian's `libmpich.so.12`)
//! compatible; the minor number grows when interfaces are added. The version
//! is read from the real file name (`libmpich.so.12.2.2` is 12.2.2); missing
//! numbers count as 0. Open MPI (`libmpi.so.40`) is a different ABI: no
//! policy makes it compatible with an MPICH-ABI host library.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How strictly the host and container library versions must agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AbiPolicy {
    /// Same major number.
    Major,
    /// Same major number, host minor >= container minor (the default: the
    /// application may use interfaces the container's newer minor added).
    Full,
    /// Same major and minor numbers, host patch >= container patch.
    Strict,
}

impl AbiPolicy {
    /// Parses `major`, `full` or `strict`.
    pub fn parse(text: &str) -> Result<AbiPolicy, String> {
        match text {
            "major" => Ok(AbiPolicy::Major),
            "full" => Ok(AbiPolicy::Full),
            "strict" => Ok(AbiPolicy::Strict),
            other => Err(format!(
                "unknown MPI ABI policy '{other}' (use major, full or strict)"
            )),
        }
    }

    /// The policy's name, as in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            AbiPolicy::Major => "major",
            AbiPolicy::Full => "full",
            AbiPolicy::Strict => "strict",
        }
    }
}

/// A library version read from a file name, `[major, minor, patch]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LibVersion(pub [u32; 3]);

impl fmt::Display for LibVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c] = self.0;
        write!(f, "{a}.{b}.{c}")
    }
}

/// The stem and version of a library file name: `libmpich.so.12.2.2` gives
/// `("libmpich", 12.2.2)`, `libmpi.so.12` gives `("libmpi", 12.0.0)`; `None`
/// when the name has no `.so.` followed by numbers.
pub fn parse_library_name(file_name: &str) -> Option<(&str, LibVersion)> {
    let (stem, numbers) = file_name.split_once(".so.")?;
    let mut version = [0u32; 3];
    let mut count = 0;
    for (slot, part) in version.iter_mut().zip(numbers.split('.')) {
        *slot = part.parse().ok()?;
        count += 1;
    }
    if count == 0 || numbers.split('.').count() > 3 {
        return None;
    }
    Some((stem, LibVersion(version)))
}

/// Whether a library stem belongs to an MPI implementation (`libmpi`,
/// `libmpich`, `libmpicxx`, `libmpifort`, `libmpi_cxx`, ...).
pub fn is_mpi_library(stem: &str) -> bool {
    stem.starts_with("libmpi")
}

/// Checks that the host library `host_file` may replace the container's
/// `container_file` (both real file names, not symlinks) under `policy`.
/// The error says what differs and what to do.
pub fn check(host_file: &str, container_file: &str, policy: AbiPolicy) -> Result<(), String> {
    let (_, host) = parse_library_name(host_file).ok_or_else(|| {
        format!("cannot read a version from the host MPI library name '{host_file}'")
    })?;
    let (container_stem, container) = parse_library_name(container_file).ok_or_else(|| {
        format!("cannot read a version from the container's MPI library name '{container_file}'")
    })?;
    let [hmaj, hmin, hpat] = host.0;
    let [cmaj, cmin, cpat] = container.0;
    if container_stem == "libmpi" && cmaj == 40 || hmaj != cmaj && cmaj >= 20 {
        return Err(format!(
            "the image's MPI is Open MPI ({container_file}), which is not MPICH-ABI compatible with \
             the host's {host_file}: Open MPI cannot be replaced by an MPICH-family MPI; rebuild \
             the application in the image against MPICH (libmpi.so.12 / libmpich.so.12), or run \
             without --container-mpi to use the image's own MPI"
        ));
    }
    let refused = |rule: &str| {
        Err(format!(
            "the host MPI library {host_file} ({host}) is not ABI-compatible with the image's \
             {container_file} ({container}) under the '{}' policy: {rule}; use an image built \
             against an MPI of the host's version, or run without --container-mpi",
            policy.name()
        ))
    };
    if hmaj != cmaj {
        return refused("the major versions differ");
    }
    match policy {
        AbiPolicy::Major => Ok(()),
        AbiPolicy::Full if hmin < cmin => {
            refused("the image's minor version is newer than the host's")
        }
        AbiPolicy::Full => Ok(()),
        AbiPolicy::Strict if hmin != cmin => refused("the minor versions differ"),
        AbiPolicy::Strict if hpat < cpat => {
            refused("the image's patch version is newer than the host's")
        }
        AbiPolicy::Strict => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_library_names() {
        assert_eq!(
            parse_library_name("libmpich.so.12.2.2"),
            Some(("libmpich", LibVersion([12, 2, 2])))
        );
        assert_eq!(
            parse_library_name("libmpi.so.12"),
            Some(("libmpi", LibVersion([12, 0, 0])))
        );
        assert_eq!(parse_library_name("libmpi.so"), None);
        assert_eq!(parse_library_name("libmpi.so.12.x"), None);
        assert_eq!(parse_library_name("libmpi.so.1.2.3.4"), None);
        assert!(is_mpi_library("libmpichfort"));
        assert!(!is_mpi_library("libfabric"));
    }

    #[test]
    fn major_policy_needs_equal_majors_only() {
        assert!(check("libmpi.so.12.0.0", "libmpich.so.12.5.1", AbiPolicy::Major).is_ok());
        let err = check("libmpi.so.13.0.0", "libmpi.so.12.1.0", AbiPolicy::Major).unwrap_err();
        assert!(err.contains("major versions differ"), "{err}");
    }

    #[test]
    fn full_policy_needs_host_minor_at_least_container_minor() {
        assert!(check("libmpich.so.12.2.2", "libmpich.so.12.2.9", AbiPolicy::Full).is_ok());
        assert!(check("libmpich.so.12.3.0", "libmpich.so.12.2.2", AbiPolicy::Full).is_ok());
        let err = check("libmpich.so.12.1.0", "libmpich.so.12.2.2", AbiPolicy::Full).unwrap_err();
        assert!(err.contains("minor version is newer"), "{err}");
        assert!(err.contains("'full' policy"), "{err}");
    }

    #[test]
    fn strict_policy_needs_equal_minor_and_newer_patch() {
        assert!(check("libmpi.so.12.2.3", "libmpi.so.12.2.2", AbiPolicy::Strict).is_ok());
        assert!(check("libmpi.so.12.3.0", "libmpi.so.12.2.2", AbiPolicy::Strict).is_err());
        let err = check("libmpi.so.12.2.1", "libmpi.so.12.2.2", AbiPolicy::Strict).unwrap_err();
        assert!(err.contains("patch version"), "{err}");
    }

    #[test]
    fn open_mpi_is_named_as_such() {
        let err = check("libmpich.so.12.2.2", "libmpi.so.40.30.4", AbiPolicy::Major).unwrap_err();
        assert!(err.contains("Open MPI"), "{err}");
        assert!(err.contains("not MPICH-ABI"), "{err}");
    }

    #[test]
    fn policies_parse_by_name() {
        for policy in [AbiPolicy::Major, AbiPolicy::Full, AbiPolicy::Strict] {
            assert_eq!(AbiPolicy::parse(policy.name()), Ok(policy));
        }
        assert!(AbiPolicy::parse("loose")
            .unwrap_err()
            .contains("major, full or strict"));
    }
}
