//! `berth doctor`: checks what a compute node needs to run berth containers
//! and says what to fix.
//!
//! Each check is a small function returning a [`Finding`]; the CLI prints one
//! line per finding and exits non-zero when any check failed. The checks only
//! read: they never load modules, create loop devices or change the store.

use std::ffi::CString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::Config;

mod slurm_release;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Works.
    Ok,
    /// Works, but something is missing for some uses or may bite later.
    Warn,
    /// berth cannot work on this node until it is fixed.
    Fail,
}

/// The result of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Verdict.
    pub level: Level,
    /// What was checked, e.g. "user namespaces".
    pub check: String,
    /// What was found.
    pub detail: String,
    /// What to do about it (empty when nothing).
    pub fix: String,
}

impl Finding {
    fn new(level: Level, check: &str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Finding {
            level,
            check: check.to_string(),
            detail: detail.into(),
            fix: fix.into(),
        }
    }

    fn ok(check: &str, detail: impl Into<String>) -> Self {
        Finding::new(Level::Ok, check, detail, "")
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.level {
            Level::Ok => "ok  ",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        };
        write!(f, "{tag} {}: {}", self.check, self.detail)?;
        if !self.fix.is_empty() {
            write!(f, "\n     fix: {}", self.fix)?;
        }
        Ok(())
    }
}

/// What to check beyond the node itself.
#[derive(Debug, Clone, Default)]
pub struct DoctorOptions {
    /// Registries (`host[:port]`) whose `/v2/` endpoint must answer.
    pub registries: Vec<String>,
    /// Minimum free space wanted in the store, in bytes.
    pub min_free_bytes: u64,
}

/// Runs every check for `config` (store path, helper, insecure registries).
pub fn run_checks(config: &Config, options: &DoctorOptions) -> Vec<Finding> {
    let mut findings = vec![
        kernel_version(),
        user_namespaces(),
        filesystem("squashfs", "squashfs", true),
        filesystem("overlay", "overlay", true),
        fuse_device(),
        loop_control(),
        tool("tar2sqfs", "squashfs-tools-ng", Level::Fail),
        tool("squashfuse", "squashfuse", Level::Warn),
        tool("fuse-overlayfs", "fuse-overlayfs", Level::Warn),
        helper(&config.helper_path),
    ];
    findings.extend(slurm_release::check());
    findings.extend(slurm_tools(config));
    findings.push(gpu_isolation(
        &crate::slurm_conf::slurm_conf_path(),
        node_has_gpu_devices(),
    ));
    findings.push(contain_spank(&crate::slurm_conf::slurm_conf_path()));
    let node = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let store_path = config.store_path_for_node(&node);
    findings.extend(store(&store_path, options.min_free_bytes));
    findings.push(pull_user(&config.pull_user, &store_path));
    for registry in &options.registries {
        let insecure = config.insecure_registries.iter().any(|r| r == registry);
        findings.push(registry_reachable(registry, insecure));
    }
    findings
}

/// The plugstack file slurmd reads: `PlugStackConfig` is not parsed; the file
/// beside `SLURM_CONF` (or /etc/slurm/slurm.conf) is assumed, as Slurm does by
/// default.
pub fn default_plugstack_file() -> PathBuf {
    let conf = std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/slurm/slurm.conf"));
    conf.with_file_name("plugstack.conf")
}

/// The arguments of the `spank_berth.so` line in plugstack file `path`,
/// following `include` lines (with `*` globs in the file name); `None` when
/// no berth line is found.
pub fn plugstack_arguments(path: &Path) -> anyhow::Result<Option<Vec<String>>> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read plugstack file {}", path.display()))?;
    for line in text.lines() {
        let words: Vec<&str> = line
            .split('#')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        match words.as_slice() {
            ["include", pattern, ..] => {
                for included in glob_files(Path::new(pattern)) {
                    if let Some(args) = plugstack_arguments(&included)? {
                        return Ok(Some(args));
                    }
                }
            }
            [_, plugin, args @ ..] if plugin.ends_with("spank_berth.so") => {
                return Ok(Some(args.iter().map(|a| a.to_string()).collect()));
            }
            _ => {}
        }
    }
    Ok(None)
}

/// Files matching `pattern`, whose last component may hold `*` wildcards.
fn glob_files(pattern: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (pattern.parent(), pattern.file_name()) else {
        return Vec::new();
    };
    let name = name.to_string_lossy();
    let parts: Vec<&str> = name.split('*').collect();
    let matches = |candidate: &str| {
        if parts.len() == 1 {
            return candidate == parts[0];
        }
        let (first, last) = (parts[0], parts[parts.len() - 1]);
        if !candidate.starts_with(first) || !candidate.ends_with(last) {
            return false;
        }
        let mut rest = &candidate[first.len()..candidate.len() - last.len()];
        for middle in &parts[1..parts.len() - 1] {
            match rest.find(middle) {
                Some(i) => rest = &rest[i + middle.len()..],
                None => return false,
            }
        }
        true
    };
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| matches(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn kernel_release() -> String {
    read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_default()
}

fn kernel_version() -> Finding {
    let release = kernel_release();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u32>().ok());
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    // openat2 (5.6), LOOP_CONFIGURE (5.8), mount_setattr (5.12).
    if (major, minor) >= (5, 12) {
        Finding::ok("kernel", format!("Linux {release}"))
    } else {
        Finding::new(
            Level::Fail,
            "kernel",
            format!("Linux {release} is older than 5.12"),
            "berth needs openat2, LOOP_CONFIGURE and mount_setattr: boot a 5.12 or newer kernel",
        )
    }
}

fn user_namespaces() -> Finding {
    let check = "user namespaces";
    let max = read_trimmed("/proc/sys/user/max_user_namespaces");
    if max.as_deref() == Some("0") {
        return Finding::new(
            Level::Fail,
            check,
            "user.max_user_namespaces is 0",
            "sysctl -w user.max_user_namespaces=65536 (and in /etc/sysctl.d)",
        );
    }
    if read_trimmed("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        return Finding::new(
            Level::Warn,
            check,
            "kernel.unprivileged_userns_clone is 0: Slurm jobs work, the CLI as an ordinary user does not",
            "sysctl -w kernel.unprivileged_userns_clone=1 to let users run `berth run`",
        );
    }
    if read_trimmed("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref()
        == Some("1")
    {
        return Finding::new(
            Level::Warn,
            check,
            "AppArmor restricts unprivileged user namespaces: the CLI as an ordinary user may fail",
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile for berth",
        );
    }
    Finding::ok(
        check,
        format!("enabled (max {})", max.unwrap_or_else(|| "?".into())),
    )
}

/// Whether the kernel knows filesystem `name` now or has a module for it.
fn filesystem(check: &str, name: &str, required: bool) -> Finding {
    let known = std::fs::read_to_string("/proc/filesystems")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().last() == Some(name));
    if known {
        return Finding::ok(check, "in the kernel");
    }
    let release = kernel_release();
    let module_listed = std::fs::read_to_string(format!("/lib/modules/{release}/modules.dep"))
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains(&format!("/{name}.ko")));
    if module_listed {
        return Finding::ok(check, "available as a module (loaded on first mount)");
    }
    Finding::new(
        if required { Level::Fail } else { Level::Warn },
        check,
        format!("the kernel has no {name} support"),
        format!("load or build the {name} module (modprobe {name})"),
    )
}

fn fuse_device() -> Finding {
    let check = "/dev/fuse";
    match std::fs::metadata("/dev/fuse") {
        Ok(_) => Finding::ok(
            check,
            "present (the CLI of ordinary users mounts with FUSE)",
        ),
        Err(e) => Finding::new(
            Level::Warn,
            check,
            format!("missing ({e}): Slurm jobs work, `berth run` as an ordinary user does not"),
            "modprobe fuse",
        ),
    }
}

fn loop_control() -> Finding {
    let check = "loop devices";
    match std::fs::metadata("/dev/loop-control") {
        Ok(_) => Finding::ok(check, "/dev/loop-control present"),
        Err(e) => Finding::new(
            Level::Fail,
            check,
            format!("/dev/loop-control: {e}"),
            "modprobe loop (images are mounted from loop devices)",
        ),
    }
}

/// The first executable named `name` on PATH (or the usual system folders).
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| is_executable(p));
    found
}

fn is_executable(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path; access only reads it.
    path.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
}

fn tool(name: &str, package: &str, missing: Level) -> Finding {
    match find_on_path(name) {
        Some(path) => Finding::ok(name, path.display().to_string()),
        None => Finding::new(
            missing,
            name,
            "not found on PATH",
            format!("apt install {package}"),
        ),
    }
}

/// The Slurm and MUNGE commands the plugin runs on the node: `scontrol` to
/// stop the pull of a cancelled job (`cancel_check`), and with
/// `fanout=sbcast`: `sbcast`, `munge` and `unmunge`.
fn slurm_tools(config: &Config) -> Vec<Finding> {
    let mut findings = Vec::new();
    if !config.cancel_check.is_zero() {
        let mut scontrol = tool("scontrol", "slurm-client", Level::Warn);
        if scontrol.level != Level::Ok {
            scontrol.detail.push_str(
                " (a scancel during a pull then waits for the pull to end; or set cancel_check=0)",
            );
        }
        findings.push(scontrol);
    }
    if config.fanout.mode == crate::config::FanoutMode::Sbcast {
        findings.push(tool("sbcast", "slurm-client", Level::Fail));
        findings.push(tool("munge", "munge", Level::Fail));
        findings.push(tool("unmunge", "munge", Level::Fail));
    }
    findings
}

fn helper(path: &Path) -> Finding {
    let check = "helper_path";
    if is_executable(path) {
        Finding::ok(check, path.display().to_string())
    } else {
        Finding::new(
            Level::Fail,
            check,
            format!("{} is not an executable file", path.display()),
            "install berth there (make install) or set helper_path= in plugstack.conf",
        )
    }
}

/// `SLURM_VERSION_NUMBER` of the Slurm headers the plugin was built
/// against (build.rs sets it); `None` for a CLI built without the plugin
/// (no `spank` feature).
fn built_for_slurm() -> Option<u64> {
    option_env!("BERTH_BUILT_FOR_SLURM").and_then(|v| v.parse().ok())
}

/// Whether `/dev/nvidiaN` exists on this node.
fn node_has_gpu_devices() -> bool {
    std::fs::read_dir("/dev").is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix("nvidia")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
    })
}

/// Whether a step's tasks can open only the GPUs Slurm gave the step. berth
/// shows a container only the step's GPUs in its `/dev`, but that is a view:
/// the access boundary is Slurm's devices cgroup (`TaskPlugin=task/cgroup`
/// with `ConstrainDevices=yes` in cgroup.conf beside `slurm_conf`).
/// `has_gpu_devices`: the node has `/dev/nvidiaN`.
fn gpu_isolation(slurm_conf: &Path, has_gpu_devices: bool) -> Finding {
    let check = "GPU isolation";
    let read = |path: &Path, key: &str| crate::slurm_conf::value(path, key);
    let (task_plugin, gres_types) = match (
        read(slurm_conf, "TaskPlugin"),
        read(slurm_conf, "GresTypes"),
    ) {
        (Ok(t), Ok(g)) => (t.unwrap_or_default(), g.unwrap_or_default()),
        (Err(e), _) | (_, Err(e)) => {
            return Finding::new(
                Level::Warn,
                check,
                format!("{e:#}"),
                "run berth doctor on a compute node, or point SLURM_CONF at its slurm.conf",
            )
        }
    };
    let slurm_gpus = gres_types.split(',').any(|t| t.trim() == "gpu");
    if !slurm_gpus && !has_gpu_devices {
        return Finding::ok(check, "no GPUs here (no /dev/nvidiaN, no gpu in GresTypes)");
    }
    let cgroup_conf = crate::slurm_conf::beside(slurm_conf, "cgroup.conf");
    let constrain = match read(&cgroup_conf, "ConstrainDevices") {
        Ok(value) => value.is_some_and(|v| crate::slurm_conf::is_yes(&v)),
        Err(_) => false, // no cgroup.conf: Slurm's default, off
    };
    let task_cgroup = task_plugin.split(',').any(|p| p.trim() == "task/cgroup");
    let fix = format!(
        "set TaskPlugin=task/cgroup (with any others) in {} and ConstrainDevices=yes in {}, \
         then restart slurmd",
        slurm_conf.display(),
        cgroup_conf.display()
    );
    let open_to_all = "a task can open every GPU of the node, also in a container (berth's \
                       /dev lists only the step's GPUs, but that is no access boundary)";
    match (task_cgroup, constrain) {
        (true, true) => Finding::ok(
            check,
            format!(
                "task/cgroup with ConstrainDevices=yes ({})",
                cgroup_conf.display()
            ),
        ),
        (false, _) => Finding::new(
            Level::Warn,
            check,
            format!("TaskPlugin is '{task_plugin}', without task/cgroup: {open_to_all}"),
            fix,
        ),
        (true, false) => Finding::new(
            Level::Warn,
            check,
            format!(
                "ConstrainDevices is not yes in {}: {open_to_all}",
                cgroup_conf.display()
            ),
            fix,
        ),
    }
}

/// `SlurmdParameters=contain_spank` (Slurm 24.05 and later) runs SPANK's
/// `user_init` and `task_exit` in clones of slurmstepd whose file
/// descriptors die with them; berth carries the step's descriptors out of
/// them (`spank::contain`), so it is reported, not refused.
fn contain_spank(slurm_conf: &Path) -> Finding {
    let check = "contain_spank";
    match crate::slurm_conf::value(slurm_conf, "SlurmdParameters") {
        Ok(Some(params)) if params.split(',').any(|p| p.trim() == "contain_spank") => Finding::ok(
            check,
            "on (SlurmdParameters): berth passes the container's descriptors out of Slurm's \
             clones of slurmstepd",
        ),
        Ok(_) => Finding::ok(check, "off (SlurmdParameters)"),
        Err(e) => Finding::new(
            Level::Warn,
            check,
            format!("{e:#}"),
            "run berth doctor on a compute node, or point SLURM_CONF at its slurm.conf",
        ),
    }
}

fn store(path: &Path, min_free: u64) -> Vec<Finding> {
    use std::os::unix::fs::MetadataExt;
    let check = "store";
    let mut findings = Vec::new();
    let existing = path
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    match std::fs::metadata(path) {
        Ok(meta) => {
            let mode = meta.mode() & 0o7777;
            if meta.uid() != 0 && nix::unistd::geteuid().is_root() {
                findings.push(Finding::new(
                    Level::Fail,
                    check,
                    format!(
                        "{} is owned by uid {}, not root",
                        path.display(),
                        meta.uid()
                    ),
                    format!("chown root: {}", path.display()),
                ));
            } else if mode & 0o022 != 0 {
                findings.push(Finding::new(
                    Level::Fail,
                    check,
                    format!(
                        "{} has mode {mode:04o}: other users can write it",
                        path.display()
                    ),
                    format!("chmod go-w {}", path.display()),
                ));
            } else {
                findings.push(Finding::ok(
                    check,
                    format!("{} (mode {mode:04o})", path.display()),
                ));
            }
        }
        Err(_) => findings.push(Finding::ok(
            check,
            format!(
                "{} does not exist yet; the first pull creates it under {}",
                path.display(),
                existing.display()
            ),
        )),
    }
    match nix::sys::statvfs::statvfs(existing) {
        Ok(stats) => {
            let free = stats.blocks_available() * stats.fragment_size();
            let text = crate::units::format_size(free);
            if free < min_free {
                findings.push(Finding::new(
                    Level::Warn,
                    "store space",
                    format!("{text} free on {}", existing.display()),
                    format!(
                        "free space (berth gc --max-size ...) or move store_path; wanted {}",
                        crate::units::format_size(min_free)
                    ),
                ));
            } else {
                findings.push(Finding::ok(
                    "store space",
                    format!("{text} free on {}", existing.display()),
                ));
            }
        }
        Err(e) => findings.push(Finding::new(
            Level::Fail,
            "store space",
            format!("cannot statvfs {}: {e}", existing.display()),
            "check store_path",
        )),
    }
    findings
}

/// The pull user (`pull_user`): it exists, is not root, can reach the
/// store, and owns the store's content areas (or will, at the first pull).
fn pull_user(name: &str, store: &Path) -> Finding {
    use std::os::unix::fs::MetadataExt;
    let check = "pull user";
    let user = match crate::puller::PullUser::lookup(name) {
        Ok(user) => user,
        Err(e) => {
            return Finding::new(
                Level::Fail,
                check,
                format!("{e:#}"),
                crate::puller::identity::create_command(name),
            )
        }
    };
    if let Err(e) = crate::puller::check_reachable(store, &user) {
        return Finding::new(
            Level::Fail,
            check,
            format!("{e:#}"),
            "let the pull user enter every folder above store_path (chmod o+x), or move the store",
        );
    }
    let foreign: Vec<String> = crate::puller::CONTENT_DIRS
        .iter()
        .map(|(area, _)| store.join(area))
        .filter(|dir| std::fs::symlink_metadata(dir).is_ok_and(|m| m.uid() != user.uid))
        .map(|dir| dir.display().to_string())
        .collect();
    if !foreign.is_empty() {
        return Finding::new(
            Level::Warn,
            check,
            format!(
                "{} (uid {}) does not own {} yet (a store of an older berth)",
                user.name,
                user.uid,
                foreign.join(", ")
            ),
            format!(
                "nothing: the first pull through Slurm hands them over; or now: chown -R {}: {}",
                user.name,
                foreign.join(" ")
            ),
        );
    }
    Finding::ok(
        check,
        format!(
            "{} (uid {}) pulls images into {}",
            user.name,
            user.uid,
            store.display()
        ),
    )
}

/// GET `/v2/` of `registry`: 200 or 401 means a registry answers.
fn registry_reachable(registry: &str, insecure: bool) -> Finding {
    let check = format!("registry {registry}");
    let scheme = if insecure { "http" } else { "https" };
    let url = format!("{scheme}://{registry}/v2/");
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .redirects(0)
        .build();
    match agent.get(&url).call() {
        Ok(resp) => Finding::ok(&check, format!("{url} answered {}", resp.status())),
        Err(ureq::Error::Status(401, _)) => {
            Finding::ok(&check, format!("{url} answered 401 (asks for a token)"))
        }
        Err(ureq::Error::Status(status, _)) => Finding::new(
            Level::Warn,
            &check,
            format!("{url} answered {status}: not a registry API?"),
            "check the registry name",
        ),
        Err(ureq::Error::Transport(t)) => Finding::new(
            Level::Fail,
            &check,
            format!("{url}: {t}"),
            if insecure {
                "check the network, proxy variables and the registry address".to_string()
            } else {
                "check the network and proxy; for a plain-HTTP registry add it to insecure_registries"
                    .to_string()
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn findings_print_the_fix() {
        let f = Finding::new(Level::Fail, "loop devices", "missing", "modprobe loop");
        assert_eq!(
            f.to_string(),
            "FAIL loop devices: missing\n     fix: modprobe loop"
        );
        assert_eq!(
            Finding::ok("kernel", "Linux 6.1").to_string(),
            "ok   kernel: Linux 6.1"
        );
    }

    #[test]
    fn slurm_tools_follow_the_configuration() {
        let names = |config: &Config| -> Vec<String> {
            slurm_tools(config).into_iter().map(|f| f.check).collect()
        };
        let mut config = Config::default();
        assert_eq!(names(&config), ["scontrol"]);
        config.cancel_check = std::time::Duration::ZERO;
        assert!(names(&config).is_empty());
        config.fanout.mode = crate::config::FanoutMode::Sbcast;
        assert_eq!(names(&config), ["sbcast", "munge", "unmunge"]);
    }

    #[test]
    fn gpu_isolation_needs_task_cgroup_and_constrain_devices() {
        let dir = tempfile::tempdir().unwrap();
        let slurm_conf = dir.path().join("slurm.conf");
        let cgroup_conf = dir.path().join("cgroup.conf");
        let write = |slurm: &str, cgroup: Option<&str>| {
            std::fs::write(&slurm_conf, slurm).unwrap();
            match cgroup {
                Some(text) => std::fs::write(&cgroup_conf, text).unwrap(),
                None => {
                    let _ = std::fs::remove_file(&cgroup_conf);
                }
            }
        };
        let gpu_site = "TaskPlugin=task/affinity,task/cgroup\nGresTypes=gpu\n";
        write(
            gpu_site,
            Some("CgroupPlugin=cgroup/v1\nConstrainDevices=yes\n"),
        );
        let f = gpu_isolation(&slurm_conf, false);
        assert_eq!(f.level, Level::Ok, "{f}");
        write(gpu_site, Some("ConstrainDevices=no\n"));
        let f = gpu_isolation(&slurm_conf, false);
        assert_eq!(f.level, Level::Warn, "{f}");
        assert!(f.detail.contains("ConstrainDevices") && f.fix.contains("ConstrainDevices=yes"));
        write(gpu_site, None);
        assert_eq!(gpu_isolation(&slurm_conf, false).level, Level::Warn);
        // GPU devices on the node count even without GRES.
        write("TaskPlugin=task/none\n", Some("ConstrainDevices=yes\n"));
        let f = gpu_isolation(&slurm_conf, true);
        assert_eq!(f.level, Level::Warn, "{f}");
        assert!(f.detail.contains("without task/cgroup"), "{f}");
        // No GPUs at all: nothing to isolate.
        assert_eq!(gpu_isolation(&slurm_conf, false).level, Level::Ok);
        // No slurm.conf: said, not failed.
        let f = gpu_isolation(&dir.path().join("none.conf"), true);
        assert_eq!(f.level, Level::Warn, "{f}");
    }

    #[test]
    fn store_problems_are_found() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let findings = store(dir.path(), 0);
        assert_eq!(findings[0].level, Level::Fail, "{findings:?}");
        assert!(findings[0].fix.contains("chmod go-w"));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let findings = store(dir.path(), u64::MAX);
        assert_eq!(findings[0].level, Level::Ok, "{findings:?}");
        assert_eq!(findings[1].level, Level::Warn, "{findings:?}");
        let missing = store(&dir.path().join("a/b"), 0);
        assert_eq!(missing[0].level, Level::Ok);
        assert!(missing[0].detail.contains("does not exist yet"));
    }

    #[test]
    fn pull_user_problems_are_found() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let missing = pull_user("no-such-berth-user", dir.path());
        assert_eq!(missing.level, Level::Fail, "{missing:?}");
        assert!(missing.fix.contains("useradd --system"), "{missing:?}");
        assert!(missing.detail.contains("pull_user"), "{missing:?}");
        let root = pull_user("root", dir.path());
        assert_eq!(root.level, Level::Fail, "{root:?}");
        if nix::unistd::geteuid().is_root() {
            std::fs::create_dir(dir.path().join("images")).unwrap();
            let old = pull_user("nobody", dir.path());
            assert_eq!(old.level, Level::Warn, "{old:?}");
            assert!(old.fix.contains("chown -R nobody:"), "{old:?}");
        }
    }

    #[test]
    fn plugstack_lines_are_found_through_includes() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("plugstack.conf.d");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("other.conf"), "optional /x/spank_other.so a=b\n").unwrap();
        std::fs::write(
            d.join("berth.conf"),
            "# comment\nrequired /usr/lib/slurm/spank_berth.so store_path=/nvme/berth # site\n",
        )
        .unwrap();
        let main = dir.path().join("plugstack.conf");
        std::fs::write(&main, format!("include {}/*.conf\n", d.display())).unwrap();
        assert_eq!(
            plugstack_arguments(&main).unwrap(),
            Some(vec!["store_path=/nvme/berth".to_string()])
        );
        std::fs::write(&main, "required /x/spank_pyxis.so\n").unwrap();
        assert_eq!(plugstack_arguments(&main).unwrap(), None);
    }

    #[test]
    fn unreachable_registry_fails_with_a_fix() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let f = registry_reachable(&format!("127.0.0.1:{port}"), true);
        assert_eq!(f.level, Level::Fail);
        assert!(f.fix.contains("network"), "{f}");
        let f = tool("surely-not-a-tool-berth", "nothing", Level::Fail);
        assert_eq!(f.level, Level::Fail);
        assert!(f.fix.contains("apt install nothing"));
    }
}
