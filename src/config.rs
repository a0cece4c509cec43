//! Site configuration: where the store lives, which registries are plain HTTP,
//! where the `berth` helper binary is.
//!
//! Values come from, in increasing precedence: built-in defaults, the config
//! file (`/etc/berth/berth.conf`, or the `config=` plugstack argument, or
//! `BERTH_CONFIG` for the CLI), and the plugstack arguments of `spank_berth.so`.
//! Both the file and the plugstack line use `key=value` with the same keys.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default config file.
pub const DEFAULT_CONFIG_FILE: &str = "/etc/berth/berth.conf";
/// Default node-local image store for root (the plugin, root CLI users).
pub const DEFAULT_STORE: &str = "/var/lib/berth";
/// Default runtime directory for per-container state.
pub const DEFAULT_RUNTIME_DIR: &str = "/run/berth";

/// Where the plugin looks for the `berth` helper when `helper_path` is not
/// set, first match wins: the Debian package installs /usr/bin/berth,
/// `make install` /usr/local/bin/berth (and writes `helper_path` into the
/// drop-in for any other prefix). Found at run time, so one build serves
/// every install location.
pub const DEFAULT_HELPERS: &[&str] = &["/usr/bin/berth", "/usr/local/bin/berth"];

/// The first of [`DEFAULT_HELPERS`] that exists (else the last one, so the
/// error names a path to install to).
pub fn default_helper() -> PathBuf {
    DEFAULT_HELPERS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_HELPERS[DEFAULT_HELPERS.len() - 1]))
}

/// Effective configuration of one plugin instance or CLI run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Image store root (node-local by default).
    pub store_path: PathBuf,
    /// Per-container runtime state (pyxis: `runtime_path`).
    pub runtime_dir: PathBuf,
    /// The `berth` binary the plugin runs for pulls and container setup.
    pub helper_path: PathBuf,
    /// Registries (`host[:port]`) reached over plain HTTP instead of HTTPS.
    pub insecure_registries: Vec<String>,
    /// Run the image ENTRYPOINT by default (pyxis: `execute_entrypoint`).
    pub execute_entrypoint: bool,
    /// Scope of named containers (pyxis: `container_scope`, `job` or `global`).
    pub container_scope: String,
    /// Whether `#SBATCH --container-*` applies to the batch script (pyxis: `sbatch_support`).
    pub sbatch_support: bool,
    /// How much the plugin writes to slurmd's log.
    pub log_level: LogLevel,
    /// Injection settings: host MPI profiles, GPU and CDI locations.
    pub inject: InjectConfig,
    /// Pull-through mirrors, `(registry, mirror)` (`mirrors=docker.io=mirror.site:5000,...`).
    pub mirrors: Vec<(String, String)>,
    /// Retries of a failed registry request (`registry_retries=N`; `None`: the built-in 3).
    pub registry_retries: Option<u32>,
    /// How a multi-node step spreads a newly pulled image to its nodes.
    pub fanout: FanoutConfig,
    /// `store_shared=1`: `store_path` is on a file system every node shares
    /// (NFS, Lustre, GPFS); the cluster pulls each image once.
    pub store_shared: bool,
    /// `store_lease_timeout=SECONDS`: a shared-store puller silent this long
    /// is taken over.
    pub store_lease_timeout: Duration,
    /// `store_wait_timeout=SECONDS`: the longest wait for another node's pull.
    pub store_wait_timeout: Duration,
    /// Seconds a registry may stay silent (connecting, or between two reads
    /// of an answer) before the request is abandoned (`registry_timeout=N`;
    /// `None`: the built-in 30 s to connect, 60 s per read).
    pub registry_timeout: Option<u32>,
    /// The unprivileged system user the image pull runs as (`pull_user`).
    pub pull_user: String,
    /// Largest flattened image a pull may write, in bytes (`max_image_size`).
    pub max_image_size: u64,
    /// Proxies for registry requests: slurmd's (or the CLI's) environment
    /// (`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`, ...), then the keys
    /// `https_proxy`, `http_proxy`, `no_proxy`.
    pub proxy: crate::registry::ProxySettings,
    /// A site CA bundle trusted beside the system's store (`ca_bundle`).
    pub ca_bundle: Option<PathBuf>,
    /// What slurmd's log should say about keys that were accepted with no
    /// effect (pyxis's keys berth has no use for), one line each.
    pub notes: Vec<String>,
    /// `cancel_check=SECONDS`: how often a step still being set up (pulling)
    /// asks slurmctld whether its job ended, to stop the pull (0: never).
    pub cancel_check: Duration,
}

/// Default of `cancel_check`.
pub const DEFAULT_CANCEL_CHECK: Duration = Duration::from_secs(5);

/// How much the plugin logs (`log_level`). Each level includes the ones
/// before it; the plugin writes its messages at Slurm's info level, so they
/// reach slurmd's log with the default `SlurmdDebug=info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Errors, and one line per container (image, digest, setup time).
    Info,
    /// Also each stage: pull, container setup, entrypoint.
    Verbose,
    /// Also the details: options, mounts, environment changes.
    Debug,
}

impl LogLevel {
    /// The names `log_level` accepts, in order.
    pub const NAMES: [&'static str; 4] = ["error", "info", "verbose", "debug"];

    /// Parses a `log_level` value.
    pub fn parse(value: &str) -> Option<LogLevel> {
        match value.to_ascii_lowercase().as_str() {
            "error" => Some(LogLevel::Error),
            "info" => Some(LogLevel::Info),
            "verbose" => Some(LogLevel::Verbose),
            "debug" => Some(LogLevel::Debug),
            _ => None,
        }
    }
}

pub use crate::inject::InjectConfig;

/// A configuration line or value that could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Where the bad value came from (file path and line, or "plugstack.conf").
    pub origin: String,
    /// What is wrong and what to write instead.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.origin, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// `fanout`: how a multi-node step spreads an image that its first node had
/// to fetch (see docs/CONFIGURATION.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanoutMode {
    /// Every node pulls from the registry itself.
    None,
    /// The step's first node pulls, then sends the squashfs with `sbcast`.
    Sbcast,
}

impl FanoutMode {
    /// Parses `none` or `sbcast`.
    pub fn parse(value: &str) -> Option<FanoutMode> {
        match value {
            "none" => Some(FanoutMode::None),
            "sbcast" => Some(FanoutMode::Sbcast),
            _ => None,
        }
    }
}

/// The fan-out settings (`fanout`, `fanout_min_nodes`, `fanout_wait`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanoutConfig {
    /// `fanout`: off (`none`, the default) or `sbcast`.
    pub mode: FanoutMode,
    /// `fanout_min_nodes`: steps on fewer nodes pull per node (default 4).
    pub min_nodes: u32,
    /// `fanout_wait`: how long a node without the image waits for the first
    /// node's squashfs before it pulls from the registry itself (default 300 s).
    pub wait: Duration,
    /// `fanout_intent_wait`: how long such a node waits for the first node to
    /// say that it fetches the image (default 10 s); without that word the
    /// first node had the image, and the node pulls at once.
    pub intent_wait: Duration,
    /// `fanout_dir`: where `sbcast` writes on every node (the same path on
    /// all nodes); default `STORE/fanout`.
    pub dir: Option<PathBuf>,
}

impl Default for FanoutConfig {
    fn default() -> Self {
        FanoutConfig {
            mode: FanoutMode::None,
            min_nodes: 4,
            wait: Duration::from_secs(300),
            intent_wait: Duration::from_secs(10),
            dir: None,
        }
    }
}

impl FanoutConfig {
    /// Whether a step on `nodes` nodes fans out.
    pub fn applies_to(&self, nodes: u32) -> bool {
        self.mode == FanoutMode::Sbcast && nodes >= self.min_nodes
    }
}

/// Every key the config file and the plugstack line accept, with what its
/// value must be: the one table from which the list of known keys and the
/// "expected ..." part of every error about a value come.
pub const KEYS: &[(&str, &str)] = &[
    ("config", "the path of a config file (plugstack line only)"),
    ("store_path", "an absolute path"),
    ("runtime_path", "an absolute path"),
    ("helper_path", "an absolute path"),
    ("insecure_registries", "host[:port] names, comma-separated"),
    ("execute_entrypoint", "1/0, true/false, yes/no"),
    ("container_scope", "`job` or `global`"),
    ("sbatch_support", "1/0, true/false, yes/no"),
    ("log_level", "one of error, info, verbose, debug"),
    ("inject_dir", "an absolute path"),
    ("gpu_dev_root", "an absolute path"),
    ("gpu_driver_root", "an absolute path"),
    ("cdi_spec_dirs", "absolute paths, comma-separated"),
    ("mirrors", "REGISTRY=MIRROR pairs, comma-separated"),
    ("registry_retries", "a number of retries from 0 to 20"),
    ("fanout", "`sbcast` or `none`"),
    ("fanout_min_nodes", "a node count of at least 2"),
    ("fanout_wait", "a number of seconds from 1 to 86400"),
    ("fanout_intent_wait", "a number of seconds from 1 to 86400"),
    ("fanout_dir", "an absolute path"),
    ("store_shared", "1/0, true/false, yes/no"),
    ("store_lease_timeout", "a number of seconds from 1 to 86400"),
    ("store_wait_timeout", "a number of seconds from 1 to 86400"),
    ("registry_timeout", "a number of seconds from 1 to 3600"),
    ("pull_user", "the name of a system user, e.g. berth"),
    (
        "max_image_size",
        "a size such as 512G or 300M (powers of 1024)",
    ),
    ("cancel_check", "a number of seconds from 0 (off) to 3600"),
    // pyxis's keys that have no berth meaning: accepted (a pyxis plugstack
    // line works unchanged), their value checked, a note logged.
    ("http_proxy", "a proxy URL, http://HOST:PORT (empty: none)"),
    ("https_proxy", "a proxy URL, http://HOST:PORT (empty: none)"),
    ("no_proxy", "host names, IP addresses or *, comma-separated"),
    (
        "ca_bundle",
        "the absolute path of a PEM file of CA certificates",
    ),
    ("use_enroot_load", "1/0, true/false, yes/no (a pyxis key)"),
    ("importer", "an absolute path (a pyxis key)"),
    ("use_squashfuse", "1/0, true/false, yes/no (a pyxis key)"),
];

/// The known keys, for messages: `config, store_path, ...`.
pub fn key_names() -> String {
    KEYS.iter()
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Default of `pull_user`: the system user `make install` and the Debian
/// package create.
pub const DEFAULT_PULL_USER: &str = "berth";

impl Default for Config {
    fn default() -> Self {
        Config {
            store_path: PathBuf::from(DEFAULT_STORE),
            runtime_dir: PathBuf::from(DEFAULT_RUNTIME_DIR),
            helper_path: default_helper(),
            insecure_registries: Vec::new(),
            execute_entrypoint: false,
            container_scope: "job".to_string(),
            sbatch_support: true,
            log_level: LogLevel::Info,
            inject: InjectConfig::default(),
            mirrors: Vec::new(),
            registry_retries: None,
            fanout: FanoutConfig::default(),
            store_shared: false,
            store_lease_timeout: crate::store::shared::DEFAULT_LEASE_TIMEOUT,
            store_wait_timeout: crate::store::shared::DEFAULT_WAIT_TIMEOUT,
            registry_timeout: None,
            pull_user: DEFAULT_PULL_USER.to_string(),
            max_image_size: crate::image::DEFAULT_MAX_IMAGE_BYTES,
            cancel_check: DEFAULT_CANCEL_CHECK,
            notes: Vec::new(),
            proxy: crate::registry::ProxySettings::default(),
            ca_bundle: None,
        }
    }
}

impl Config {
    /// The store folder for `node`: `%n` in `store_path` becomes the node name
    /// (for sites, and tests, whose nodes share one file system).
    pub fn store_path_for_node(&self, node: &str) -> PathBuf {
        let text = self.store_path.to_string_lossy();
        if text.contains("%n") && !node.is_empty() {
            PathBuf::from(text.replace("%n", node))
        } else {
            self.store_path.clone()
        }
    }

    /// Where this node keeps state that must not be shared with other nodes
    /// (named containers, save scratch folders): the store itself, or
    /// `STORE/nodes/NODE` when the store is shared (`store_shared=1`).
    pub fn node_state_path(&self, node: &str) -> PathBuf {
        let store = self.store_path_for_node(node);
        if self.store_shared && !node.is_empty() {
            store.join("nodes").join(node)
        } else {
            store
        }
    }

    /// The shared-store settings, when `store_shared=1`.
    pub fn shared_settings(&self) -> Option<crate::store::SharedSettings> {
        self.store_shared.then_some(crate::store::SharedSettings {
            lease_timeout: self.store_lease_timeout,
            wait_timeout: self.store_wait_timeout,
        })
    }

    /// Checks combinations of keys no single value can: a shared store has
    /// one path for all nodes, so no `%n`.
    fn check(&self, origin: &str) -> Result<(), ConfigError> {
        if self.store_shared && self.store_path.to_string_lossy().contains("%n") {
            return Err(ConfigError {
                origin: origin.to_string(),
                message: format!(
                    "store_shared=1 with store_path={} : a shared store is one folder for \
                     every node; remove %n from store_path, or drop store_shared",
                    self.store_path.display()
                ),
            });
        }
        Ok(())
    }

    /// Builds the plugin's configuration from its plugstack arguments: defaults,
    /// then the config file (if present, or the one `config=` names, which must
    /// exist), then the arguments themselves.
    pub fn from_plugstack_args(args: &[String]) -> Result<Config, ConfigError> {
        let origin = "plugstack.conf arguments of spank_berth.so";
        let pairs = args
            .iter()
            .map(|arg| split_pair(arg, origin))
            .collect::<Result<Vec<_>, _>>()?;
        let explicit_file = pairs.iter().find(|(k, _)| k == "config").map(|(_, v)| v);
        // slurmd's proxies, as for every program it starts; the keys win.
        let mut config = Config {
            proxy: crate::registry::ProxySettings::from_env(),
            ..Config::default()
        };
        match explicit_file {
            Some(path) => config.apply_file(Path::new(path), true)?,
            None => config.apply_file(Path::new(DEFAULT_CONFIG_FILE), false)?,
        }
        for (key, value) in &pairs {
            config.set(key, value, origin)?;
        }
        config.check_fanout(origin)?;
        config.check(origin)?;
        Ok(config)
    }

    /// Fan-out needs one path that is the same on every node: a `store_path`
    /// with `%n` differs per node, so it then needs `fanout_dir`.
    fn check_fanout(&self, origin: &str) -> Result<(), ConfigError> {
        if self.fanout.mode == FanoutMode::Sbcast
            && self.fanout.dir.is_none()
            && self.store_path.to_string_lossy().contains("%n")
        {
            return Err(ConfigError {
                origin: origin.to_string(),
                message: "fanout=sbcast with a store_path containing %n needs fanout_dir=PATH \
                          (sbcast writes the same path on every node; give a node-local folder)"
                    .to_string(),
            });
        }
        Ok(())
    }

    /// Where fan-out files go on this node: `fanout_dir`, else `STORE/fanout`.
    pub fn fanout_dir(&self, node: &str) -> PathBuf {
        match &self.fanout.dir {
            Some(dir) => dir.clone(),
            None => self.store_path_for_node(node).join("fanout"),
        }
    }

    /// Builds the CLI's configuration: the config file (`BERTH_CONFIG` or the
    /// default), with the store in the user's cache when not root.
    pub fn for_cli() -> Result<Config, ConfigError> {
        let mut config = Config {
            proxy: crate::registry::ProxySettings::from_env(),
            ..Config::default()
        };
        if !nix::unistd::geteuid().is_root() {
            config.store_path = user_store_dir();
            config.runtime_dir = user_runtime_dir();
        }
        match std::env::var_os("BERTH_CONFIG") {
            Some(path) => config.apply_file(Path::new(&path), true)?,
            None => config.apply_file(Path::new(DEFAULT_CONFIG_FILE), false)?,
        }
        if !nix::unistd::geteuid().is_root() {
            // An ordinary user cannot write the node store; keep the user's own.
            config.store_path = user_store_dir();
            config.runtime_dir = user_runtime_dir();
        }
        Ok(config)
    }

    /// Reads `key=value` lines from `path` (`#` comments, blank lines allowed).
    pub fn apply_file(&mut self, path: &Path, must_exist: bool) -> Result<(), ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => return Ok(()),
            Err(e) => {
                return Err(ConfigError {
                    origin: path.display().to_string(),
                    message: format!("cannot read the berth config file: {e}"),
                })
            }
        };
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let origin = format!("{}:{}", path.display(), number + 1);
            let (key, value) = split_pair(line, &origin)?;
            if key == "config" {
                return Err(ConfigError {
                    origin,
                    message: "`config` is only valid on the plugstack line".into(),
                });
            }
            self.set(&key, &value, &origin)?;
        }
        Ok(())
    }

    /// Sets one key; unknown keys and malformed values are errors, which say
    /// what the value must be (from [`KEYS`]).
    pub fn set(&mut self, key: &str, value: &str, origin: &str) -> Result<(), ConfigError> {
        let fail = |message: String| ConfigError {
            origin: origin.to_string(),
            message,
        };
        let Some(&(_, expected)) = KEYS.iter().find(|(name, _)| *name == key) else {
            return Err(fail(format!(
                "unknown argument `{key}` (known: {})",
                key_names()
            )));
        };
        let bad = || fail(format!("{key}={value}: expected {expected}"));
        let absolute = |value: &str| -> Result<PathBuf, ConfigError> {
            if value.starts_with('/') {
                Ok(PathBuf::from(value))
            } else {
                Err(fail(format!("{key}={value}: expected {expected}")))
            }
        };
        let boolean = || parse_bool(value).ok_or_else(bad);
        match key {
            "config" => {}
            "store_path" => self.store_path = absolute(value)?,
            "runtime_path" => self.runtime_dir = absolute(value)?,
            "helper_path" => self.helper_path = absolute(value)?,
            "insecure_registries" => {
                self.insecure_registries = value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            }
            "execute_entrypoint" => self.execute_entrypoint = boolean()?,
            "sbatch_support" => self.sbatch_support = boolean()?,
            "log_level" => self.log_level = LogLevel::parse(value).ok_or_else(bad)?,
            "inject_dir" => self.inject.profile_dir = absolute(value)?,
            "gpu_dev_root" => self.inject.gpu_dev_root = absolute(value)?,
            "gpu_driver_root" => self.inject.gpu_driver_root = Some(absolute(value)?),
            "cdi_spec_dirs" => {
                self.inject.cdi_spec_dirs = value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(absolute)
                    .collect::<Result<_, _>>()?
            }
            "mirrors" => {
                self.mirrors = parse_mirrors(value)
                    .map_err(|e| fail(format!("{key}={value}: expected {expected}: {e}")))?
            }
            "registry_retries" => {
                let n: u32 = value.parse().ok().filter(|n| *n <= 20).ok_or_else(bad)?;
                self.registry_retries = Some(n);
            }
            "fanout" => self.fanout.mode = FanoutMode::parse(value).ok_or_else(bad)?,
            "fanout_min_nodes" => {
                self.fanout.min_nodes = value.parse().ok().filter(|n| *n >= 2).ok_or_else(bad)?
            }
            "fanout_dir" => self.fanout.dir = Some(absolute(value)?),
            "store_shared" => self.store_shared = boolean()?,
            "fanout_wait" | "fanout_intent_wait" | "store_lease_timeout" | "store_wait_timeout" => {
                let seconds: u64 = value
                    .parse()
                    .ok()
                    .filter(|s| (1..=86_400).contains(s))
                    .ok_or_else(bad)?;
                let duration = Duration::from_secs(seconds);
                match key {
                    "fanout_wait" => self.fanout.wait = duration,
                    "fanout_intent_wait" => self.fanout.intent_wait = duration,
                    "store_lease_timeout" => self.store_lease_timeout = duration,
                    _ => self.store_wait_timeout = duration,
                }
            }
            "cancel_check" => {
                let seconds: u64 = value.parse().ok().filter(|s| *s <= 3600).ok_or_else(bad)?;
                self.cancel_check = Duration::from_secs(seconds);
            }
            "registry_timeout" => {
                let n: u32 = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=3600).contains(n))
                    .ok_or_else(bad)?;
                self.registry_timeout = Some(n);
            }
            "pull_user" => {
                let valid = !value.is_empty()
                    && value.len() <= 32
                    && value
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
                if !valid {
                    return Err(bad());
                }
                self.pull_user = value.to_string();
            }
            "max_image_size" => {
                let bytes = crate::store::units::parse_size(value)
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(bad)?;
                self.max_image_size = bytes;
            }
            "container_scope" => match value {
                "job" | "global" => self.container_scope = value.to_string(),
                _ => return Err(bad()),
            },
            "http_proxy" | "https_proxy" => {
                let url = value.trim();
                let proxy = if url.is_empty() {
                    None
                } else if url.starts_with("http://") && url.len() > "http://".len() {
                    Some(url.to_string())
                } else {
                    return Err(bad());
                };
                if key == "http_proxy" {
                    self.proxy.http = proxy;
                } else {
                    self.proxy.https = proxy;
                }
            }
            "no_proxy" => {
                self.proxy.no_proxy = value
                    .split(',')
                    .map(|e| e.trim().to_ascii_lowercase())
                    .filter(|e| !e.is_empty())
                    .collect()
            }
            "ca_bundle" => {
                let path = absolute(value)?;
                crate::registry::trust::bundle_certificates(&path)
                    .map_err(|e| fail(format!("{key}={value}: {e:#}")))?;
                self.ca_bundle = Some(path);
            }
            "use_enroot_load" | "use_squashfuse" => {
                boolean()?;
                self.note_pyxis_key(key, value, origin);
            }
            "importer" => {
                absolute(value)?;
                self.note_pyxis_key(key, value, origin);
            }
            _ => unreachable!("`{key}` is in KEYS but has no arm in Config::set"),
        }
        Ok(())
    }
}

impl Config {
    /// Records that pyxis's `key` was accepted with no effect, and why.
    fn note_pyxis_key(&mut self, key: &str, value: &str, origin: &str) {
        let why = match key {
            "use_enroot_load" => {
                "berth never unpacks an image (there is no `enroot create` to skip): \
                 every image is mounted from its squashfs"
            }
            "importer" => {
                "berth pulls images itself and does not run an importer: give what the \
                 importer did as berth settings (mirrors, credentials, inject profiles; \
                 docs/MIGRATING.md)"
            }
            _ => "berth chooses how each image is mounted (docs/SECURITY.md)",
        };
        self.notes.push(format!(
            "{origin}: {key}={value} is a pyxis key with no effect in berth: {why}"
        ));
    }
}

/// Parses `REGISTRY=MIRROR[,REGISTRY=MIRROR...]`, both `host[:port]`
/// (e.g. `docker.io=mirror.site:5000`).
pub fn parse_mirrors(value: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = |why: &str| {
            format!("`{item}` {why}: write REGISTRY=MIRROR, e.g. docker.io=mirror.site:5000")
        };
        let (registry, mirror) = item.split_once('=').ok_or_else(|| bad("has no `=`"))?;
        let (registry, mirror) = (registry.trim(), mirror.trim());
        for host in [registry, mirror] {
            if host.is_empty() || host.contains(['/', ' ', '@']) || host.contains("://") {
                return Err(bad("is not host[:port] on both sides"));
            }
        }
        out.push((registry.to_string(), mirror.to_string()));
    }
    Ok(out)
}

/// Parses pyxis-style booleans: 1/true/yes/y and 0/false/no/n.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "y" => Some(true),
        "0" | "false" | "no" | "n" => Some(false),
        _ => None,
    }
}

fn split_pair(text: &str, origin: &str) -> Result<(String, String), ConfigError> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(ConfigError {
            origin: origin.to_string(),
            message: format!("`{text}` is not key=value (known keys: {})", key_names()),
        }),
    }
}

fn user_store_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("berth");
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(home) => PathBuf::from(home).join(".cache/berth"),
        None => PathBuf::from(format!("/tmp/berth-{}", nix::unistd::getuid())),
    }
}

fn user_runtime_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("berth"),
        None => PathBuf::from(format!("/tmp/berth-run-{}", nix::unistd::getuid())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn plugstack_args_override_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("berth.conf");
        std::fs::write(
            &file,
            "# site\nstore_path=/nvme/berth\ninsecure_registries=a:5000\n",
        )
        .unwrap();
        let config = Config::from_plugstack_args(&args(&[
            &format!("config={}", file.display()),
            "insecure_registries=b:1, c",
            "execute_entrypoint=yes",
        ]))
        .unwrap();
        assert_eq!(config.store_path, PathBuf::from("/nvme/berth"));
        assert_eq!(config.insecure_registries, vec!["b:1", "c"]);
        assert!(config.execute_entrypoint);
        assert_eq!(config.log_level, LogLevel::Info);
        assert!(config.sbatch_support);
        let config =
            Config::from_plugstack_args(&args(&["log_level=DEBUG", "sbatch_support=0"])).unwrap();
        assert_eq!(config.log_level, LogLevel::Debug);
        assert!(!config.sbatch_support);
        assert!(LogLevel::Error < LogLevel::Info && LogLevel::Verbose < LogLevel::Debug);
    }

    #[test]
    fn unknown_and_malformed_arguments_are_named() {
        let e = Config::from_plugstack_args(&args(&["bogus=1"])).unwrap_err();
        assert!(e.to_string().contains("unknown argument `bogus`"), "{e}");
        let e = Config::from_plugstack_args(&args(&["store_path=relative"])).unwrap_err();
        assert!(e.to_string().contains("absolute path"), "{e}");
        let e = Config::from_plugstack_args(&args(&["novalue"])).unwrap_err();
        assert!(e.to_string().contains("not key=value"), "{e}");
        let e =
            Config::from_plugstack_args(&args(&["config=/nonexistent/berth.conf"])).unwrap_err();
        assert!(e.to_string().contains("cannot read"), "{e}");
        let e = Config::from_plugstack_args(&args(&["log_level=loud"])).unwrap_err();
        assert!(
            e.to_string()
                .contains("log_level=loud: expected one of error, info, verbose, debug"),
            "{e}"
        );
    }

    /// Every key of pyxis 0.24's plugstack line is accepted; those berth has
    /// no use for leave one note each, and their values are still checked.
    #[test]
    fn pyxis_plugstack_keys_are_accepted_with_a_note() {
        let config = Config::from_plugstack_args(&args(&[
            "runtime_path=/run/pyxis",
            "execute_entrypoint=1",
            "container_scope=global",
            "sbatch_support=1",
            "use_enroot_load=1",
            "importer=/usr/share/pyxis/importer",
            "use_squashfuse=0",
        ]))
        .unwrap();
        assert!(config.execute_entrypoint);
        assert_eq!(config.container_scope, "global");
        assert_eq!(config.notes.len(), 3, "{:?}", config.notes);
        for key in ["use_enroot_load=1", "importer=", "use_squashfuse=0"] {
            assert!(
                config
                    .notes
                    .iter()
                    .any(|n| n.contains(key) && n.contains("pyxis key with no effect")),
                "{key}: {:?}",
                config.notes
            );
        }
        let e = Config::from_plugstack_args(&args(&["use_enroot_load=maybe"])).unwrap_err();
        assert!(e.to_string().contains("use_enroot_load=maybe"), "{e}");
        let e = Config::from_plugstack_args(&args(&["importer=importer.sh"])).unwrap_err();
        assert!(e.to_string().contains("absolute path"), "{e}");
    }

    /// Proxy keys replace the environment's settings for what they name;
    /// a CA bundle must hold certificates.
    #[test]
    fn proxies_and_a_ca_bundle() {
        let config = Config::from_plugstack_args(&args(&[
            "https_proxy=http://proxy.site:3128",
            "http_proxy=http://10.0.0.1:8080",
            "no_proxy=registry.lan, .internal,10.1.2.3",
        ]))
        .unwrap();
        assert_eq!(
            config.proxy.https.as_deref(),
            Some("http://proxy.site:3128")
        );
        assert_eq!(config.proxy.http.as_deref(), Some("http://10.0.0.1:8080"));
        assert_eq!(
            config.proxy.proxy_for("https", "nvcr.io", 443),
            Some("http://proxy.site:3128")
        );
        assert_eq!(config.proxy.proxy_for("https", "registry.lan", 443), None);
        assert_eq!(config.proxy.proxy_for("http", "a.internal", 80), None);
        let none = Config::from_plugstack_args(&args(&["https_proxy="])).unwrap();
        assert_eq!(none.proxy.https, None);
        let e = Config::from_plugstack_args(&args(&["https_proxy=proxy.site:3128"])).unwrap_err();
        assert!(e.to_string().contains("http://HOST:PORT"), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let e = Config::from_plugstack_args(&args(&[&format!("ca_bundle={}", empty.display())]))
            .unwrap_err();
        assert!(e.to_string().contains("holds no certificate"), "{e}");
        let e = Config::from_plugstack_args(&args(&["ca_bundle=site.pem"])).unwrap_err();
        assert!(e.to_string().contains("absolute path"), "{e}");
    }

    #[test]
    fn mirrors_and_retries() {
        let config = Config::from_plugstack_args(&args(&[
            "mirrors=docker.io=mirror.site:5000, ghcr.io=10.0.0.1:5001",
            "registry_retries=5",
            "registry_timeout=7",
        ]))
        .unwrap();
        assert_eq!(
            config.mirrors,
            vec![
                ("docker.io".to_string(), "mirror.site:5000".to_string()),
                ("ghcr.io".to_string(), "10.0.0.1:5001".to_string())
            ]
        );
        assert_eq!(config.registry_retries, Some(5));
        assert_eq!(config.registry_timeout, Some(7));
        let config =
            Config::from_plugstack_args(&args(&["pull_user=puller", "max_image_size=512G"]))
                .unwrap();
        assert_eq!(config.pull_user, "puller");
        assert_eq!(config.max_image_size, 512 << 30);
        assert_eq!(Config::default().pull_user, "berth");
        assert_eq!(
            Config::default().max_image_size,
            crate::image::DEFAULT_MAX_IMAGE_BYTES
        );
        for bad in [
            "pull_user=",
            "pull_user=a b",
            "max_image_size=big",
            "max_image_size=0",
        ] {
            let e = Config::from_plugstack_args(&args(&[bad])).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
        for bad in [
            "mirrors=docker.io",
            "mirrors=docker.io=https://m",
            "registry_retries=x",
            "registry_timeout=0",
            "registry_timeout=5s",
            "cancel_check=5s",
            "cancel_check=3601",
        ] {
            let e = Config::from_plugstack_args(&args(&[bad])).unwrap_err();
            assert!(
                e.to_string().contains(bad.split('=').next().unwrap()),
                "{e}"
            );
        }
        let e = Config::from_plugstack_args(&args(&["mirrors=a=/m"])).unwrap_err();
        assert!(e.to_string().contains("REGISTRY=MIRROR"), "{e}");
    }

    #[test]
    fn cancel_check_key() {
        assert_eq!(Config::default().cancel_check, DEFAULT_CANCEL_CHECK);
        let off = Config::from_plugstack_args(&args(&["cancel_check=0"])).unwrap();
        assert_eq!(off.cancel_check, Duration::ZERO);
        let slow = Config::from_plugstack_args(&args(&["cancel_check=30"])).unwrap();
        assert_eq!(slow.cancel_check, Duration::from_secs(30));
    }

    #[test]
    fn shared_store_keys() {
        let config = Config::from_plugstack_args(&args(&[
            "store_path=/shared/berth",
            "store_shared=1",
            "store_lease_timeout=10",
            "store_wait_timeout=600",
        ]))
        .unwrap();
        let settings = config.shared_settings().unwrap();
        assert_eq!(settings.lease_timeout, Duration::from_secs(10));
        assert_eq!(settings.wait_timeout, Duration::from_secs(600));
        assert_eq!(
            config.node_state_path("node3"),
            PathBuf::from("/shared/berth/nodes/node3")
        );
        let local = Config::from_plugstack_args(&args(&["store_path=/nvme/%n/berth"])).unwrap();
        assert!(local.shared_settings().is_none());
        assert_eq!(
            local.node_state_path("node3"),
            PathBuf::from("/nvme/node3/berth")
        );
        let e = Config::from_plugstack_args(&args(&["store_path=/s/%n", "store_shared=yes"]))
            .unwrap_err();
        assert!(e.to_string().contains("remove %n from store_path"), "{e}");
        for bad in [
            "store_lease_timeout=0",
            "store_wait_timeout=x",
            "store_shared=maybe",
        ] {
            let e = Config::from_plugstack_args(&args(&[bad])).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn every_key_has_one_entry_an_arm_and_a_line_in_the_docs() {
        // The injection keys are documented with injection.
        let docs = [
            include_str!("../docs/CONFIGURATION.md"),
            include_str!("../docs/INJECTION.md"),
        ]
        .concat();
        let mut seen = std::collections::BTreeSet::new();
        for (key, expected) in KEYS {
            assert!(seen.insert(key), "{key} twice in KEYS");
            assert!(
                docs.contains(&format!("`{key}`")),
                "{key} is not in CONFIGURATION.md"
            );
            // A value no key accepts: the error says what the table says.
            let mut config = Config::default();
            if let Err(e) = config.set(key, "\u{1}bad", "test") {
                assert!(e.message.contains(expected), "{key}: {e}");
            }
        }
        assert!(KEYS
            .iter()
            .any(|(k, e)| *k == "log_level"
                && *e == format!("one of {}", LogLevel::NAMES.join(", "))));
        let e = Config::default().set("nope", "1", "o").unwrap_err();
        assert!(e.message.contains(&key_names()), "{e}");
    }

    #[test]
    fn booleans() {
        for t in ["1", "true", "YES", "y"] {
            assert_eq!(parse_bool(t), Some(true));
        }
        for f in ["0", "false", "No", "n"] {
            assert_eq!(parse_bool(f), Some(false));
        }
        assert_eq!(parse_bool("maybe"), None);
    }

    #[test]
    fn fanout_keys() {
        let config = Config::from_plugstack_args(&[]).unwrap();
        assert_eq!(config.fanout.mode, FanoutMode::None);
        assert!(!config.fanout.applies_to(100));
        let config = Config::from_plugstack_args(&args(&[
            "fanout=sbcast",
            "fanout_min_nodes=3",
            "fanout_wait=20",
            "fanout_intent_wait=3",
        ]))
        .unwrap();
        assert_eq!(config.fanout.intent_wait, Duration::from_secs(3));
        assert!(config.fanout.applies_to(3) && !config.fanout.applies_to(2));
        assert_eq!(config.fanout.wait, Duration::from_secs(20));
        let e =
            Config::from_plugstack_args(&args(&["fanout=sbcast", "store_path=/s/%n"])).unwrap_err();
        assert!(e.to_string().contains("needs fanout_dir"), "{e}");
        let config = Config::from_plugstack_args(&args(&[
            "fanout=sbcast",
            "store_path=/s/%n",
            "fanout_dir=/tmp/f",
        ]))
        .unwrap();
        assert_eq!(config.fanout_dir("n1"), PathBuf::from("/tmp/f"));
        for bad in [
            "fanout=tree",
            "fanout_min_nodes=1",
            "fanout_wait=0",
            "fanout_wait=x",
        ] {
            let e = Config::from_plugstack_args(&args(&[bad])).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }
}
