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
    /// enroot's site configuration folder, read where present
    /// ([`crate::enroot_site`]).
    pub enroot_config_path: PathBuf,
    /// `enroot_hook_timeout=SECONDS`: how long each site hook of
    /// `hooks.d` may run before it is killed and the step fails.
    pub enroot_hook_timeout: Duration,
    /// Registries (`host[:port]`) reached over plain HTTP instead of HTTPS.
    pub insecure_registries: Vec<String>,
    /// Run the image ENTRYPOINT by default (pyxis: `execute_entrypoint`).
    pub execute_entrypoint: bool,
    /// Scope of named containers (pyxis: `container_scope`, `job` or `global`).
    pub container_scope: ContainerScope,
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
    /// zstd level of the squashfs files registry pulls write (`squashfs_level`).
    pub squashfs_level: i32,
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

mod keys;
pub use keys::{key_names, Key, Kind, KEYS};

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

/// How long a named container lives (`container_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerScope {
    /// Until its job ends (`job`, the default): the job epilog removes it.
    Job,
    /// Until its user removes it (`global`): any later job of the user may use it.
    Global,
}

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

/// Default of `pull_user`: the system user `make install` and the Debian
/// package create.
pub const DEFAULT_PULL_USER: &str = "berth";

impl Default for Config {
    fn default() -> Self {
        Config {
            store_path: PathBuf::from(DEFAULT_STORE),
            runtime_dir: PathBuf::from(DEFAULT_RUNTIME_DIR),
            enroot_config_path: PathBuf::from("/etc/enroot"),
            enroot_hook_timeout: Duration::from_secs(60),
            helper_path: default_helper(),
            insecure_registries: Vec::new(),
            execute_entrypoint: false,
            container_scope: ContainerScope::Job,
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
            squashfs_level: crate::image::DEFAULT_ZSTD_LEVEL,
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
        config.take_enroot_network();
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
        config.take_enroot_network();
        Ok(config)
    }

    /// enroot's proxies and CA bundle (`http_proxy`, `https_proxy`,
    /// `all_proxy`, `no_proxy`, `SSL_CERT_FILE` in `enroot.conf` and
    /// `enroot.conf.d` of `enroot_config_path`, as root may read them) for
    /// what berth's settings and the environment leave unset, so that a
    /// pyxis + enroot site behind a proxy pulls with its files as they are.
    /// A proxy without a scheme is `http://` (as curl, which enroot runs,
    /// takes it); a value berth cannot use is left out with a note.
    fn take_enroot_network(&mut self) {
        let (read, _) = crate::enroot_site::EnrootSite::read_conf(&self.enroot_config_path);
        let settings = crate::enroot_site::conf::network_settings(&read);
        let origin = format!("{}/enroot.conf", self.enroot_config_path.display());
        // The specific proxies first: all_proxy only fills what they leave.
        for name in crate::enroot_site::conf::NETWORK_NAMES {
            let Some(&(_, value)) = settings.iter().find(|(n, _)| *n == name) else {
                continue;
            };
            let (keys, value): (&[&str], String) = match name {
                "all_proxy" => (&["http_proxy", "https_proxy"], with_scheme(value)),
                "http_proxy" => (&["http_proxy"], with_scheme(value)),
                "https_proxy" => (&["https_proxy"], with_scheme(value)),
                "no_proxy" => (&["no_proxy"], value.to_string()),
                _ => (&["ca_bundle"], value.to_string()),
            };
            for key in keys {
                let unset = match *key {
                    "http_proxy" => self.proxy.http.is_none(),
                    "https_proxy" => self.proxy.https.is_none(),
                    "no_proxy" => self.proxy.no_proxy.is_empty(),
                    _ => self.ca_bundle.is_none(),
                };
                if unset {
                    if let Err(e) = self.set(key, &value, &origin) {
                        self.notes
                            .push(format!("{name} of enroot's configuration not used: {e}"));
                    }
                }
            }
        }
    }

    /// Reads `key=value` lines from `path` (`#` comments, blank lines allowed).
    ///
    /// Read with root's uid (slurmd, slurmstepd, an admin's `berth`), the
    /// file is used only when root alone can change it and every folder and
    /// link on the way to it ([`crate::root_files::read_following_links`]):
    /// its settings name programs root runs (`helper_path`) and folders root
    /// writes.
    pub fn apply_file(&mut self, path: &Path, must_exist: bool) -> Result<(), ConfigError> {
        let text = match read_config_file(path) {
            Ok(Some(text)) => text,
            Ok(None) if !must_exist => return Ok(()),
            Ok(None) => {
                return Err(ConfigError {
                    origin: path.display().to_string(),
                    message: "cannot read the berth config file: it does not exist (create it, \
                              or name another one with config=PATH)"
                        .into(),
                })
            }
            Err(message) => {
                return Err(ConfigError {
                    origin: path.display().to_string(),
                    message,
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
}

/// A proxy URL as curl takes it: without a scheme, `http://`.
fn with_scheme(value: &str) -> String {
    if value.contains("://") {
        value.to_string()
    } else {
        format!("http://{value}")
    }
}

/// The text of the config file `path`, `Ok(None)` when it does not exist;
/// with root's uid (real or effective), only a file root alone can change.
fn read_config_file(path: &Path) -> Result<Option<String>, String> {
    let as_root = nix::unistd::getuid().is_root() || nix::unistd::geteuid().is_root();
    if as_root {
        return crate::root_files::read_following_links(path).map_err(|why| {
            if !why.contains(" is not used: ") {
                return why;
            }
            format!(
                "{why}; berth runs as root here (as in slurmd and slurmstepd), and root \
                 uses only a config file that no one else can change: make the file and \
                 every folder above it root's and writable by no group or other user \
                 (chown root:root FILE; chmod go-w FILE and its folders)"
            )
        });
    }
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read the berth config file: {e}")),
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
mod tests;
