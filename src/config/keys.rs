//! The one table of configuration keys: each row names a key, the kind of
//! value it takes (which parses the value, says what an error expects, and
//! sets the parsed value), its default and one line of what it does. The
//! list of known keys in messages, the "expected ..." part of every error
//! and [`Config::set`] all come from [`KEYS`]: adding a key is one row.

use std::path::PathBuf;
use std::time::Duration;

use super::{parse_bool, parse_mirrors, Config, ConfigError, ContainerScope, FanoutMode, LogLevel};

/// What a key's value must be, and where the parsed value goes.
#[derive(Clone, Copy)]
pub enum Kind {
    /// A boolean: 1/true/yes/y or 0/false/no/n.
    Bool(fn(&mut Config, bool)),
    /// An absolute path.
    Path(fn(&mut Config, PathBuf)),
    /// Absolute paths, comma-separated (empty items skipped).
    Paths(fn(&mut Config, Vec<PathBuf>)),
    /// Names, comma-separated and trimmed (empty items skipped); the text
    /// says what names.
    Names(&'static str, fn(&mut Config, Vec<String>)),
    /// A whole number of seconds in `min..=max`.
    Seconds(u64, u64, fn(&mut Config, Duration)),
    /// A whole number in `min..=max`; the text says of what.
    Count(&'static str, u32, u32, fn(&mut Config, u32)),
    /// A size in bytes (`512G`, `300M`; powers of 1024), above 0.
    Size(fn(&mut Config, u64)),
    /// One of these words, in any case.
    OneOf(&'static [&'static str], fn(&mut Config, &str)),
    /// Anything the setter accepts: what it must be, a value it accepts
    /// (for the table's test), and the setter, which answers `Err(None)` for
    /// a bad value or `Err(Some(why))` to add why.
    Text {
        /// What the value must be, for errors.
        expected: &'static str,
        /// A valid value.
        sample: &'static str,
        /// Checks and sets the value.
        set: fn(&mut Config, &str) -> Result<(), Option<String>>,
    },
}

impl Kind {
    /// What a value must be, for errors: "expected {this}".
    pub fn expected(&self) -> String {
        match self {
            Kind::Bool(_) => "1/0, true/false, yes/no".to_string(),
            Kind::Path(_) => "an absolute path".to_string(),
            Kind::Paths(_) => "absolute paths, comma-separated".to_string(),
            Kind::Names(what, _) => format!("{what}, comma-separated"),
            Kind::Seconds(0, max, _) => format!("a number of seconds from 0 (off) to {max}"),
            Kind::Seconds(min, max, _) => format!("a number of seconds from {min} to {max}"),
            Kind::Count(what, min, u32::MAX, _) => format!("{what} of at least {min}"),
            Kind::Count(what, min, max, _) => format!("{what} from {min} to {max}"),
            Kind::Size(_) => "a size such as 512G or 300M (powers of 1024)".to_string(),
            Kind::OneOf(words, _) => format!("one of {}", words.join(", ")),
            Kind::Text { expected, .. } => expected.to_string(),
        }
    }

    /// A value of this kind that parses (the table's test sets each key to it).
    pub fn sample(&self) -> String {
        match self {
            Kind::Bool(_) => "1".to_string(),
            Kind::Path(_) => "/tmp".to_string(),
            Kind::Paths(_) => "/tmp, /var/tmp".to_string(),
            Kind::Names(..) => "a.example:5000, b".to_string(),
            Kind::Seconds(_, max, _) => max.to_string(),
            Kind::Count(_, min, _, _) => min.to_string(),
            Kind::Size(_) => "300M".to_string(),
            Kind::OneOf(words, _) => words[words.len() - 1].to_ascii_uppercase(),
            Kind::Text { sample, .. } => sample.to_string(),
        }
    }

    /// Parses `value` and sets it on `config`: `Err(None)` when it is not of
    /// this kind, `Err(Some(why))` with more to say.
    fn apply(&self, config: &mut Config, value: &str) -> Result<(), Option<String>> {
        let absolute = |item: &str| {
            item.starts_with('/')
                .then(|| PathBuf::from(item))
                .ok_or(None)
        };
        let items = || value.split(',').map(str::trim).filter(|s| !s.is_empty());
        match *self {
            Kind::Bool(set) => set(config, parse_bool(value).ok_or(None)?),
            Kind::Path(set) => set(config, absolute(value)?),
            Kind::Paths(set) => set(config, items().map(absolute).collect::<Result<_, _>>()?),
            Kind::Names(_, set) => set(config, items().map(str::to_string).collect()),
            Kind::Seconds(min, max, set) => {
                let seconds: u64 = value.parse().map_err(|_| None)?;
                if !(min..=max).contains(&seconds) {
                    return Err(None);
                }
                set(config, Duration::from_secs(seconds))
            }
            Kind::Count(_, min, max, set) => {
                let n: u32 = value.parse().map_err(|_| None)?;
                if !(min..=max).contains(&n) {
                    return Err(None);
                }
                set(config, n)
            }
            Kind::Size(set) => {
                let bytes = crate::units::parse_size(value).map_err(|_| None)?;
                set(config, (bytes > 0).then_some(bytes).ok_or(None)?)
            }
            Kind::OneOf(words, set) => {
                let word = value.to_ascii_lowercase();
                let word = words.iter().find(|w| **w == word).ok_or(None)?;
                set(config, word)
            }
            Kind::Text { set, .. } => set(config, value)?,
        }
        Ok(())
    }
}

/// One configuration key.
#[derive(Clone, Copy)]
pub struct Key {
    /// The key, as written in berth.conf and on the plugstack line.
    pub name: &'static str,
    /// Its value: how it parses and where it goes.
    pub kind: Kind,
    /// Its default, as docs/CONFIGURATION.md writes it (`-`: none).
    pub default: &'static str,
    /// What it does, in one line.
    pub doc: &'static str,
    /// For pyxis's keys that berth accepts with no effect: why they have none
    /// (logged once when the configuration is read).
    pub no_effect: Option<&'static str>,
}

/// A row of [`KEYS`] for a key that has an effect.
const fn key(name: &'static str, kind: Kind, default: &'static str, doc: &'static str) -> Key {
    Key {
        name,
        kind,
        default,
        doc,
        no_effect: None,
    }
}

/// A row of [`KEYS`] for a pyxis key that berth checks and ignores.
const fn pyxis(name: &'static str, kind: Kind, why: &'static str) -> Key {
    Key {
        name,
        kind,
        default: "-",
        doc: "a pyxis key with no effect in berth",
        no_effect: Some(why),
    }
}

/// Keeps the value nowhere (keys read before the table, or ignored).
fn ignore<T>(_: &mut Config, _: T) {}

/// `http_proxy`/`https_proxy`: `http://HOST:PORT`, or empty for none.
fn proxy_url(value: &str) -> Result<Option<String>, Option<String>> {
    let url = value.trim();
    if url.is_empty() {
        Ok(None)
    } else if url.starts_with("http://") && url.len() > "http://".len() {
        Ok(Some(url.to_string()))
    } else {
        Err(None)
    }
}

/// What every proxy key expects.
const PROXY_URL: &str = "a proxy URL, http://HOST:PORT (empty: none)";

/// Every key the config file and the plugstack line accept.
pub const KEYS: &[Key] = &[
    key(
        "config",
        Kind::Text {
            expected: "the path of a config file (plugstack line only)",
            sample: "/etc/berth/berth.conf",
            set: |_, _| Ok(()),
        },
        "/etc/berth/berth.conf",
        "the config file to read (it must exist when given); plugstack line only",
    ),
    key(
        "store_path",
        Kind::Path(|c, v| c.store_path = v),
        "/var/lib/berth",
        "the image store; `%n` becomes the node name",
    ),
    key(
        "runtime_path",
        Kind::Path(|c, v| c.runtime_dir = v),
        "/run/berth",
        "per-container runtime state (records of running named containers)",
    ),
    key(
        "enroot_config_path",
        Kind::Path(|c, v| c.enroot_config_path = v),
        "/etc/enroot",
        "enroot's site configuration read where present (enroot.conf defaults, mounts.d, environ.d, hooks.d)",
    ),
    key(
        "enroot_hook_timeout",
        Kind::Seconds(1, 3600, |c, v| c.enroot_hook_timeout = v),
        "60",
        "seconds each site hook of enroot's hooks.d may run before it is killed and the step fails",
    ),
    key(
        "helper_path",
        Kind::Path(|c, v| c.helper_path = v),
        "/usr/bin/berth",
        "the berth binary the plugin runs for pulls and container setup",
    ),
    key(
        "insecure_registries",
        Kind::Names("host[:port] names", |c, v| c.insecure_registries = v),
        "none",
        "registries reached over plain HTTP",
    ),
    key(
        "execute_entrypoint",
        Kind::Bool(|c, v| c.execute_entrypoint = v),
        "0",
        "run the image ENTRYPOINT when the job says neither way",
    ),
    key(
        "container_scope",
        Kind::OneOf(&["job", "global"], |c, v| {
            c.container_scope = match v {
                "global" => ContainerScope::Global,
                _ => ContainerScope::Job,
            }
        }),
        "job",
        "scope of named containers",
    ),
    key(
        "sbatch_support",
        Kind::Bool(|c, v| c.sbatch_support = v),
        "1",
        "sbatch and salloc accept the --container-* options",
    ),
    key(
        "log_level",
        Kind::OneOf(&LogLevel::NAMES, |c, v| {
            c.log_level = LogLevel::parse(v).unwrap_or(LogLevel::Info)
        }),
        "info",
        "how much berth writes to slurmd's log",
    ),
    key(
        "inject_dir",
        Kind::Path(|c, v| c.inject.profile_dir = v),
        "/etc/berth/inject.d",
        "folder of the host MPI / interconnect profiles",
    ),
    key(
        "gpu_dev_root",
        Kind::Path(|c, v| c.inject.gpu_dev_root = v),
        "/dev",
        "where the nvidia* device nodes are",
    ),
    key(
        "gpu_driver_root",
        Kind::Path(|c, v| c.inject.gpu_driver_root = Some(v)),
        "none",
        "a driver installation root searched before ld.so.cache",
    ),
    key(
        "cdi_spec_dirs",
        Kind::Paths(|c, v| c.inject.cdi_spec_dirs = v),
        "/etc/cdi,/var/run/cdi",
        "CDI spec folders",
    ),
    key(
        "mirrors",
        Kind::Text {
            expected: "REGISTRY=MIRROR pairs, comma-separated",
            sample: "docker.io=mirror.site:5000",
            set: |c, v| {
                c.mirrors = parse_mirrors(v).map_err(Some)?;
                Ok(())
            },
        },
        "none",
        "pull-through mirrors asked before the registry",
    ),
    key(
        "registry_retries",
        Kind::Count("a number of retries", 0, 20, |c, v| {
            c.registry_retries = Some(v)
        }),
        "3",
        "how often a failed registry request is retried",
    ),
    key(
        "fanout",
        Kind::OneOf(&["none", "sbcast"], |c, v| {
            c.fanout.mode = FanoutMode::parse(v).unwrap_or(FanoutMode::None)
        }),
        "none",
        "how a multi-node step spreads a new image to its nodes",
    ),
    key(
        "fanout_min_nodes",
        Kind::Count("a node count", 2, u32::MAX, |c, v| c.fanout.min_nodes = v),
        "4",
        "steps on fewer nodes pull per node",
    ),
    key(
        "fanout_wait",
        Kind::Seconds(1, 86_400, |c, v| c.fanout.wait = v),
        "300",
        "how long a node waits for the first node's squashfs",
    ),
    key(
        "fanout_intent_wait",
        Kind::Seconds(1, 86_400, |c, v| c.fanout.intent_wait = v),
        "10",
        "how long a node waits for the first node to say it fetches",
    ),
    key(
        "fanout_dir",
        Kind::Path(|c, v| c.fanout.dir = Some(v)),
        "STORE/fanout",
        "node-local folder where sbcast writes",
    ),
    key(
        "store_shared",
        Kind::Bool(|c, v| c.store_shared = v),
        "0",
        "store_path is one folder every node shares",
    ),
    key(
        "store_lease_timeout",
        Kind::Seconds(1, 86_400, |c, v| c.store_lease_timeout = v),
        "30",
        "shared store: a silent puller is taken over after this",
    ),
    key(
        "store_wait_timeout",
        Kind::Seconds(1, 86_400, |c, v| c.store_wait_timeout = v),
        "1800",
        "shared store: the longest wait for another node's pull",
    ),
    key(
        "registry_timeout",
        Kind::Seconds(1, 3600, |c, v| {
            c.registry_timeout = u32::try_from(v.as_secs()).ok()
        }),
        "30",
        "seconds a registry may stay silent before a request is abandoned",
    ),
    key(
        "pull_user",
        Kind::Text {
            expected: "the name of a system user, e.g. berth",
            sample: "berth",
            set: |c, v| {
                let valid = !v.is_empty()
                    && v.len() <= 32
                    && v.chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '_' | '-' | '.'));
                if !valid {
                    return Err(None);
                }
                c.pull_user = v.to_string();
                Ok(())
            },
        },
        "berth",
        "the unprivileged system user image pulls run as",
    ),
    key(
        "max_image_size",
        Kind::Size(|c, v| c.max_image_size = v),
        "256G",
        "the most a flattened image may expand to",
    ),
    key(
        "squashfs_level",
        Kind::Count("zstd level", 1, 19, |c, v| c.squashfs_level = v as i32),
        "3",
        "the zstd level of the squashfs files registry pulls write",
    ),
    key(
        "cancel_check",
        Kind::Seconds(0, 3600, |c, v| c.cancel_check = v),
        "5",
        "how often a step being set up asks whether its job ended",
    ),
    key(
        "http_proxy",
        Kind::Text {
            expected: PROXY_URL,
            sample: "http://proxy.site:3128",
            set: |c, v| {
                c.proxy.http = proxy_url(v)?;
                Ok(())
            },
        },
        "HTTP_PROXY",
        "the proxy for http:// registries",
    ),
    key(
        "https_proxy",
        Kind::Text {
            expected: PROXY_URL,
            sample: "http://proxy.site:3128",
            set: |c, v| {
                c.proxy.https = proxy_url(v)?;
                Ok(())
            },
        },
        "HTTPS_PROXY",
        "the proxy for https:// registries",
    ),
    key(
        "no_proxy",
        Kind::Names("host names, IP addresses or *", |c, v| {
            c.proxy.no_proxy = v.iter().map(|e| e.to_ascii_lowercase()).collect()
        }),
        "NO_PROXY",
        "registries reached without a proxy",
    ),
    key(
        "ca_bundle",
        Kind::Text {
            expected: "the absolute path of a PEM file of CA certificates",
            sample: "/etc/ssl/certs/ca-certificates.crt",
            set: |c, v| {
                if !v.starts_with('/') {
                    return Err(None);
                }
                let path = PathBuf::from(v);
                crate::registry::trust::bundle_certificates(&path)
                    .map_err(|e| Some(format!("{e:#}")))?;
                c.ca_bundle = Some(path);
                Ok(())
            },
        },
        "none",
        "a site CA bundle trusted beside the system's",
    ),
    pyxis(
        "use_enroot_load",
        Kind::Bool(ignore),
        "berth never unpacks an image (there is no `enroot create` to skip): \
         every image is mounted from its squashfs",
    ),
    pyxis(
        "importer",
        Kind::Path(ignore),
        "berth pulls images itself and does not run an importer: give what the \
         importer did as berth settings (mirrors, credentials, inject profiles; \
         docs/MIGRATING.md)",
    ),
    pyxis(
        "use_squashfuse",
        Kind::Bool(ignore),
        "berth chooses how each image is mounted (docs/SECURITY.md)",
    ),
];

/// The known keys, for messages: `config, store_path, ...`.
pub fn key_names() -> String {
    KEYS.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
}

impl Config {
    /// Sets one key; unknown keys and malformed values are errors, which say
    /// what the value must be (from [`KEYS`]).
    pub fn set(&mut self, key: &str, value: &str, origin: &str) -> Result<(), ConfigError> {
        let fail = |message: String| ConfigError {
            origin: origin.to_string(),
            message,
        };
        let Some(row) = KEYS.iter().find(|k| k.name == key) else {
            return Err(fail(format!(
                "unknown argument `{key}` (known: {})",
                key_names()
            )));
        };
        if let Err(why) = row.kind.apply(self, value) {
            let expected = row.kind.expected();
            return Err(fail(match why {
                None => format!("{key}={value}: expected {expected}"),
                Some(why) => format!("{key}={value}: expected {expected}: {why}"),
            }));
        }
        if let Some(why) = row.no_effect {
            self.notes.push(format!(
                "{origin}: {key}={value} is a pyxis key with no effect in berth: {why}"
            ));
        }
        Ok(())
    }
}
