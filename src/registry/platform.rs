//! Platforms (`os`/`architecture`/`variant`) and how this machine matches them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The platform a manifest in an image index is built for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// Operating system, e.g. `linux`.
    #[serde(default)]
    pub os: String,
    /// CPU architecture in OCI/Go naming, e.g. `amd64`, `arm64`.
    #[serde(default)]
    pub architecture: String,
    /// CPU variant, e.g. `v8` for arm64 or `v7` for arm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    /// The platform of this machine: `linux` and the OCI name of the CPU it was built for.
    pub fn current() -> Platform {
        let architecture = oci_arch(std::env::consts::ARCH);
        let variant = match architecture {
            "arm64" => Some("v8".to_string()),
            "arm" => Some("v7".to_string()),
            _ => None,
        };
        Platform {
            os: "linux".to_string(),
            architecture: architecture.to_string(),
            variant,
        }
    }

    /// How well `candidate` fits this (wanted) platform: `None` when it cannot run
    /// here, otherwise a rank where lower is better.
    ///
    /// The OS and architecture must be equal. Variants: an exact match ranks first,
    /// a candidate without variant next; for 32-bit `arm`, older variants run on
    /// newer CPUs (`v7` runs `v6` and `v5`) and rank after those. Other variant
    /// mismatches do not match.
    pub fn match_rank(&self, candidate: &Platform) -> Option<u32> {
        if candidate.os != self.os || candidate.architecture != self.architecture {
            return None;
        }
        match (self.variant.as_deref(), candidate.variant.as_deref()) {
            (_, None) => Some(1),
            (None, Some(_)) => Some(2),
            (Some(want), Some(have)) if want == have => Some(0),
            (Some(want), Some(have)) if self.architecture == "arm" => {
                let level = |v: &str| v.strip_prefix('v').and_then(|n| n.parse::<u32>().ok());
                match (level(want), level(have)) {
                    (Some(w), Some(h)) if h < w => Some(2 + (w - h)),
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let os = if self.os.is_empty() { "?" } else { &self.os };
        let arch = if self.architecture.is_empty() {
            "?"
        } else {
            &self.architecture
        };
        write!(f, "{os}/{arch}")?;
        if let Some(variant) = &self.variant {
            write!(f, "/{variant}")?;
        }
        Ok(())
    }
}

/// Maps Rust's `std::env::consts::ARCH` to the OCI (Go `GOARCH`) name.
pub fn oci_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "arm" => "arm",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "powerpc64" => "ppc64",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        "loongarch64" => "loong64",
        "mips64" if cfg!(target_endian = "little") => "mips64le",
        "mips64" => "mips64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(os: &str, arch: &str, variant: Option<&str>) -> Platform {
        Platform {
            os: os.into(),
            architecture: arch.into(),
            variant: variant.map(Into::into),
        }
    }

    #[test]
    fn arch_names() {
        assert_eq!(oci_arch("x86_64"), "amd64");
        assert_eq!(oci_arch("aarch64"), "arm64");
        assert_eq!(oci_arch("x86"), "386");
        let current = Platform::current();
        assert_eq!(current.os, "linux");
        assert!(!current.architecture.is_empty());
    }

    #[test]
    fn matching() {
        let amd = p("linux", "amd64", None);
        assert_eq!(amd.match_rank(&p("linux", "amd64", None)), Some(1));
        assert_eq!(amd.match_rank(&p("linux", "arm64", None)), None);
        assert_eq!(amd.match_rank(&p("windows", "amd64", None)), None);
        assert_eq!(amd.match_rank(&p("unknown", "unknown", None)), None);

        let arm64 = p("linux", "arm64", Some("v8"));
        assert_eq!(arm64.match_rank(&p("linux", "arm64", Some("v8"))), Some(0));
        assert_eq!(arm64.match_rank(&p("linux", "arm64", None)), Some(1));
        assert_eq!(arm64.match_rank(&p("linux", "arm64", Some("v9"))), None);

        let arm = p("linux", "arm", Some("v7"));
        assert_eq!(arm.match_rank(&p("linux", "arm", Some("v7"))), Some(0));
        assert!(arm.match_rank(&p("linux", "arm", Some("v6"))).unwrap() > 1);
        assert_eq!(arm.match_rank(&p("linux", "arm", Some("v8"))), None);
    }

    #[test]
    fn display() {
        assert_eq!(p("linux", "arm", Some("v7")).to_string(), "linux/arm/v7");
        assert_eq!(p("linux", "amd64", None).to_string(), "linux/amd64");
    }
}
