//! Site profiles for host MPI and interconnect libraries (the "bind
//! approach"): one file per profile in the profile folder
//! (`inject_dir`, default `/etc/berth/inject.d`), `NAME.conf`:
//!
//! ```text
//! # /etc/berth/inject.d/host.conf: the host's MPICH over libfabric
//! when = request           # request (default): --container-mpi=NAME, BERTH_CONTAINER_MPI,
//!                          #   or the image label berth.mpi=NAME; always: every container
//! mpi_abi = full           # major | full (default) | strict | off
//! library = libmpich.so.12 # soname (host ldconfig cache) or absolute path; repeatable
//! dependency = libfabric.so.1
//! device = /dev/infiniband/*
//! bind = /etc/libfabric
//! env = FI_PROVIDER=tcp
//! ```
//!
//! `library` entries whose name starts with `libmpi` are ABI-checked against
//! the image's copy (see [`crate::container::injection::abi`]); `dependency` entries are
//! injected as they are.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::{HostLibrary, Injection};
use crate::container::injection::abi::{parse_library_name, AbiPolicy};
use crate::container::injection::ldcache::LdCache;
use crate::container::spec::MountSpec;

/// Default folder of the profiles.
pub const DEFAULT_INJECT_DIR: &str = "/etc/berth/inject.d";
/// The image label that requests a profile by name.
pub const MPI_LABEL: &str = "berth.mpi";

/// When a profile applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Only when the job (or the image label) asks for it by name.
    Request,
    /// In every container.
    Always,
}

/// One parsed profile file, not yet resolved against the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// File stem: what `--container-mpi` names.
    pub name: String,
    /// When it applies.
    pub when: When,
    /// ABI policy for its MPI libraries; `None` when `mpi_abi = off`.
    pub mpi_abi: Option<AbiPolicy>,
    /// Libraries replacing the image's (sonames or absolute paths).
    pub libraries: Vec<String>,
    /// Further libraries they need.
    pub dependencies: Vec<String>,
    /// Device nodes (a `*` in the last component is a wildcard).
    pub devices: Vec<String>,
    /// Other files and folders, bound read-only at the same path (a `*` in
    /// the last component is a wildcard, which may match nothing).
    pub binds: Vec<PathBuf>,
    /// `NAME=VALUE` settings for the container.
    pub env: Vec<String>,
}

impl Profile {
    /// Parses a profile file's text; `origin` names the file in errors.
    pub fn parse(name: &str, text: &str, origin: &str) -> anyhow::Result<Profile> {
        let mut profile = Profile {
            name: name.to_string(),
            when: When::Request,
            mpi_abi: Some(AbiPolicy::Full),
            libraries: Vec::new(),
            dependencies: Vec::new(),
            devices: Vec::new(),
            binds: Vec::new(),
            env: Vec::new(),
        };
        for (number, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let at = || format!("{origin}:{}", number + 1);
            let Some((key, value)) = line.split_once('=') else {
                bail!("{}: expected 'key = value', got '{line}'", at());
            };
            let (key, value) = (key.trim(), value.trim().to_string());
            match key {
                "when" => {
                    profile.when = match value.as_str() {
                        "request" => When::Request,
                        "always" => When::Always,
                        _ => bail!("{}: when = {value}: use 'request' or 'always'", at()),
                    }
                }
                "mpi_abi" if value == "off" => profile.mpi_abi = None,
                "mpi_abi" => {
                    profile.mpi_abi = Some(AbiPolicy::parse(&value).map_err(|_| {
                        anyhow::anyhow!(
                            "{}: mpi_abi = {value}: use major, full, strict or off",
                            at()
                        )
                    })?)
                }
                "library" => profile.libraries.push(value),
                "dependency" => profile.dependencies.push(value),
                "device" | "bind" if !value.starts_with('/') => {
                    bail!("{}: {key} = {value}: must be an absolute path", at())
                }
                "device" => profile.devices.push(value),
                "bind" => profile.binds.push(PathBuf::from(value)),
                "env" if value.split_once('=').is_none_or(|(n, _)| n.is_empty()) => {
                    bail!("{}: env = {value}: write env = NAME=VALUE", at())
                }
                "env" => profile.env.push(value),
                _ => bail!(
                    "{}: unknown key '{key}' (known: when, mpi_abi, library, dependency, device, \
                     bind, env)",
                    at()
                ),
            }
        }
        Ok(profile)
    }

    /// Reads `NAME.conf` from `dir`; a clear error when there is no such profile.
    pub fn load(dir: &Path, name: &str) -> anyhow::Result<Profile> {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            bail!(
                "'{name}' is not a profile name (a file name in {})",
                dir.display()
            );
        }
        let path = dir.join(format!("{name}.conf"));
        let text = std::fs::read_to_string(&path).map_err(|e| {
            let known = list(dir).unwrap_or_default();
            anyhow::anyhow!(
                "no host MPI profile '{name}' ({}: {e}); profiles this site offers: {}",
                path.display(),
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )
        })?;
        Profile::parse(name, &text, &path.display().to_string())
    }

    /// Resolves the profile against the host: sonames through `host_cache`,
    /// symlinks to real files, device wildcards to existing nodes. A listed
    /// library the host lacks is an error for the site to fix.
    pub fn resolve(&self, host_cache: &LdCache) -> anyhow::Result<Injection> {
        let origin = format!("profile {}", self.name);
        let mut injection = Injection {
            summary: vec![origin.clone()],
            env: self.env.clone(),
            ..Injection::default()
        };
        let entries = self
            .libraries
            .iter()
            .map(|name| (name, true))
            .chain(self.dependencies.iter().map(|name| (name, false)));
        for (name, is_library) in entries {
            let library = host_library(name, host_cache, &origin)?;
            let is_mpi = parse_library_name(&library.soname)
                .is_some_and(|(stem, _)| crate::container::injection::abi::is_mpi_library(stem));
            injection.libraries.push(HostLibrary {
                abi: if is_library && is_mpi {
                    self.mpi_abi
                } else {
                    None
                },
                ..library
            });
        }
        for pattern in &self.devices {
            injection.devices.extend(
                expand("device", pattern)?
                    .into_iter()
                    .map(MountSpec::same_path),
            );
        }
        for pattern in &self.binds {
            let pattern = pattern.to_string_lossy();
            if !pattern.contains('*') && !Path::new(pattern.as_ref()).exists() {
                bail!("{origin}: bind = {pattern}: no such file or folder on this node");
            }
            for path in expand("bind", &pattern)? {
                injection.files.push(MountSpec {
                    read_only: true,
                    ..MountSpec::same_path(&path)
                });
            }
        }
        Ok(injection)
    }
}

/// The profile names in `dir`.
pub fn list(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".conf")
                .map(str::to_string)
        })
        .collect();
    names.sort();
    Ok(names)
}

/// The profiles for one container: those marked `always`, plus the one the
/// job asked for (`requested`, from `--container-mpi`; `none` asks for none),
/// else the one the image's `berth.mpi` label names.
pub fn select(
    dir: &Path,
    requested: Option<&str>,
    image_label: Option<&str>,
) -> anyhow::Result<Vec<Profile>> {
    let mut profiles = Vec::new();
    if let Ok(names) = list(dir) {
        for name in names {
            let profile = Profile::load(dir, &name)?;
            if profile.when == When::Always {
                profiles.push(profile);
            }
        }
    }
    let wanted = match requested {
        Some("none") => None,
        Some(name) => Some(name),
        None => image_label,
    };
    if let Some(name) = wanted {
        if !profiles.iter().any(|p| p.name == name) {
            profiles.push(Profile::load(dir, name)?);
        }
    }
    Ok(profiles)
}

/// A library by soname (through the host's loader cache) or absolute path.
pub fn host_library(name: &str, host_cache: &LdCache, origin: &str) -> anyhow::Result<HostLibrary> {
    let given = if name.starts_with('/') {
        PathBuf::from(name)
    } else {
        host_cache
            .lookup(name)
            .map(Path::to_path_buf)
            .with_context(|| {
                format!(
                    "{origin}: the host's loader cache has no library '{name}' (is it installed? \
                 run ldconfig, or give an absolute path)"
                )
            })?
    };
    let real = std::fs::canonicalize(&given)
        .with_context(|| format!("{origin}: library {} does not exist", given.display()))?;
    let soname = if name.starts_with('/') {
        soname_of(&given)
    } else {
        name.to_string()
    };
    Ok(HostLibrary {
        soname,
        host_path: real,
        abi: None,
        origin: origin.to_string(),
    })
}

/// The soname a library file name stands for: `libmpich.so.12.2.2` ->
/// `libmpich.so.12`; names without a version stay as they are.
pub fn soname_of(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match parse_library_name(&name) {
        Some((stem, version)) => format!("{stem}.so.{}", version.0[0]),
        None => name,
    }
}

/// Existing paths matching `pattern` (a value of the profile key `key`,
/// for messages), where a `*` may appear in the last component only; it
/// may match nothing. A pattern without `*` must exist.
fn expand(key: &str, pattern: &str) -> anyhow::Result<Vec<PathBuf>> {
    let path = Path::new(pattern);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Some((prefix, suffix)) = name.split_once('*') else {
        if !path.exists() {
            bail!("{key} {pattern} does not exist on this node");
        }
        return Ok(vec![path.to_path_buf()]);
    };
    let parent = path.parent().unwrap_or(Path::new("/"));
    if parent.to_string_lossy().contains('*') {
        bail!("{key} = {pattern}: '*' is only allowed in the last component");
    }
    let mut found: Vec<PathBuf> = match std::fs::read_dir(parent) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.len() >= prefix.len() + suffix.len()
                    && n.starts_with(prefix)
                    && n.ends_with(suffix)
            })
            .map(|e| e.path())
            .collect(),
        Err(_) => Vec::new(),
    };
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# host MPICH\nwhen = always\nmpi_abi = strict\n\
        library = libc.so.6\ndependency = /bin/true\ndevice = /dev/nul*\n\
        bind = /etc/hostname\nenv = FI_PROVIDER=tcp\n";

    #[test]
    fn parses_every_key() {
        let p = Profile::parse("host", TEXT, "host.conf").unwrap();
        assert_eq!(p.when, When::Always);
        assert_eq!(p.mpi_abi, Some(AbiPolicy::Strict));
        assert_eq!(p.libraries, vec!["libc.so.6"]);
        assert_eq!(p.dependencies, vec!["/bin/true"]);
        assert_eq!(p.devices, vec!["/dev/nul*"]);
        assert_eq!(p.env, vec!["FI_PROVIDER=tcp"]);
        let off = Profile::parse("x", "mpi_abi = off", "x.conf").unwrap();
        assert_eq!(off.mpi_abi, None);
    }

    #[test]
    fn bad_lines_name_file_line_and_fix() {
        for (text, wanted) in [
            ("when = sometimes", "host.conf:1: when = sometimes"),
            ("\nlibrary", "host.conf:2: expected 'key = value'"),
            ("color = red", "unknown key 'color'"),
            ("device = dev/x", "must be an absolute path"),
            ("env = NOVALUE", "write env = NAME=VALUE"),
            ("mpi_abi = loose", "use major, full, strict or off"),
        ] {
            let err = Profile::parse("host", text, "host.conf").unwrap_err();
            assert!(format!("{err:#}").contains(wanted), "{text}: {err:#}");
        }
    }

    #[test]
    fn resolves_sonames_paths_devices_and_binds() {
        let cache = LdCache::read(Path::new("/etc/ld.so.cache")).unwrap();
        let p = Profile::parse("host", TEXT, "host.conf").unwrap();
        let inj = p.resolve(&cache).unwrap();
        assert_eq!(inj.libraries[0].soname, "libc.so.6");
        assert!(inj.libraries[0].host_path.is_absolute());
        assert!(!inj.libraries[0].host_path.is_symlink());
        assert_eq!(inj.libraries[0].abi, None, "libc is no MPI library");
        assert_eq!(inj.devices.len(), 1);
        assert_eq!(inj.devices[0].target, Path::new("/dev/null"));
        assert!(inj.files[0].read_only);
        assert_eq!(inj.env, vec!["FI_PROVIDER=tcp"]);
        let missing = Profile::parse("m", "library = libnot-there.so.7", "m.conf").unwrap();
        let err = missing.resolve(&cache).unwrap_err();
        assert!(
            format!("{err:#}").contains("no library 'libnot-there.so.7'"),
            "{err:#}"
        );
    }

    #[test]
    fn sonames_from_file_names() {
        assert_eq!(
            soname_of(Path::new("/x/libmpich.so.12.2.2")),
            "libmpich.so.12"
        );
        assert_eq!(soname_of(Path::new("/x/libfoo.so")), "libfoo.so");
    }

    #[test]
    fn selection_by_request_label_and_always() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("host.conf"), "library = libc.so.6\n").unwrap();
        std::fs::write(dir.path().join("site.conf"), "when = always\n").unwrap();
        let names = |v: Vec<Profile>| v.into_iter().map(|p| p.name).collect::<Vec<_>>();
        assert_eq!(names(select(dir.path(), None, None).unwrap()), ["site"]);
        assert_eq!(
            names(select(dir.path(), Some("host"), None).unwrap()),
            ["site", "host"]
        );
        assert_eq!(
            names(select(dir.path(), None, Some("host")).unwrap()),
            ["site", "host"]
        );
        assert_eq!(
            names(select(dir.path(), Some("none"), Some("host")).unwrap()),
            ["site"]
        );
        let err = select(dir.path(), Some("cray"), None).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("no host MPI profile 'cray'"), "{text}");
        assert!(text.contains("host, site"), "{text}");
    }

    #[test]
    fn a_bind_wildcard_gives_every_match_and_may_match_none() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["libx.so.1.2.0", "libx.so.1.3.0", "liby.so.1"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let text = format!(
            "bind = {d}/libx.so.1.*\nbind = {d}/libnone.so.*\n",
            d = dir.path().display()
        );
        let profile = Profile::parse("wild", &text, "test").unwrap();
        let inj = profile.resolve(&LdCache::default()).unwrap();
        let bound: Vec<_> = inj.files.iter().map(|f| f.target.clone()).collect();
        assert_eq!(
            bound,
            [
                dir.path().join("libx.so.1.2.0"),
                dir.path().join("libx.so.1.3.0")
            ]
        );
        assert!(inj.files.iter().all(|f| f.read_only));
        let missing = Profile::parse(
            "gone",
            &format!("bind = {}/libz.so.1\n", dir.path().display()),
            "test",
        )
        .unwrap()
        .resolve(&LdCache::default())
        .unwrap_err()
        .to_string();
        assert!(missing.contains("no such file or folder"), "{missing}");
    }
}
