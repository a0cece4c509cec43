//! Shared helpers for the integration tests that drive the real test cluster
//! (tests/harness): srun/sbatch as root or as the ordinary test user, the
//! registry's address, node state and leftover checks.
//!
//! The cluster's environment file is named by `BERTH_TEST_ENV` (tests/run.sh
//! sets it). Without it the cluster tests print why and pass vacuously, so a
//! plain `cargo test` stays fast; tests/run.sh sets `BERTH_REQUIRE_CLUSTER=1`,
//! which turns a missing cluster into a failure.

#![allow(dead_code)]

pub mod private;
pub mod proxy;

use std::collections::HashMap;
use std::process::{Command, Output};
use std::time::Duration;

/// The ordinary user the harness creates.
pub const TEST_USER: &str = "berthuser";

/// Who submits a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitter {
    /// root
    Root,
    /// the ordinary test user
    User,
}

/// Both submitters, for tests that must pass for each.
pub const BOTH: [Submitter; 2] = [Submitter::Root, Submitter::User];

/// The running test cluster.
pub struct Cluster {
    env: HashMap<String, String>,
}

/// What a finished command printed.
pub struct Run {
    /// Exit code (-1 when killed).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Panics with the whole output unless the command succeeded.
    pub fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "command failed\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout, self.stderr
        );
        self
    }

    /// Panics with the whole output unless the command failed and its
    /// standard error holds `needle`; `context` (may be empty) says which
    /// case of a table it was. The one check of "run, expect failure,
    /// expect this text".
    pub fn failed_with(self, needle: &str, context: &str) -> Run {
        let run = self.failed();
        assert!(
            run.stderr.contains(needle),
            "{context}{}expected '{needle}' in the error\n--- stdout\n{}\n--- stderr\n{}",
            if context.is_empty() { "" } else { ": " },
            run.stdout,
            run.stderr
        );
        run
    }

    /// Panics unless the command failed.
    pub fn failed(self) -> Run {
        assert_ne!(
            self.code, 0,
            "command should have failed\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout, self.stderr
        );
        self
    }
}

impl Cluster {
    /// The cluster, or `None` (with a printed reason) when none is configured.
    pub fn get() -> Option<Cluster> {
        let Ok(path) = std::env::var("BERTH_TEST_ENV") else {
            if std::env::var("BERTH_REQUIRE_CLUSTER").is_ok() {
                panic!("BERTH_REQUIRE_CLUSTER is set but BERTH_TEST_ENV is not");
            }
            eprintln!("skipped: no test cluster (run tests/run.sh, or set BERTH_TEST_ENV)");
            return None;
        };
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read cluster env file {path}: {e}"));
        let env = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| {
                (
                    k.to_string(),
                    v.trim_matches(|c| c == '"' || c == '\'').to_string(),
                )
            })
            .collect();
        Some(Cluster { env })
    }

    /// The cluster's first node (of `BERTH_TEST_NODE_NAMES`).
    pub fn first_node(&self) -> String {
        self.var("BERTH_TEST_NODE_NAMES")
            .split([' ', ','])
            .find(|n| !n.is_empty())
            .expect("a node name")
            .to_string()
    }

    /// The node store of `node` (the test plugstack line's `store_path`).
    pub fn node_store(&self, node: &str) -> std::path::PathBuf {
        std::path::Path::new(&self.var("BERTH_TEST_STATE_DIR"))
            .join("nodes")
            .join(node)
            .join("berth-store")
    }

    /// A variable of the cluster's env file.
    pub fn var(&self, name: &str) -> String {
        self.env
            .get(name)
            .cloned()
            .unwrap_or_else(|| panic!("cluster env file has no {name}"))
    }

    /// The anonymous registry, `host:port`.
    pub fn registry(&self) -> String {
        self.var("BERTH_TEST_REGISTRY")
    }

    /// A test image in the anonymous registry, docker style.
    pub fn image(&self, name: &str) -> String {
        format!("{}/{name}", self.registry())
    }

    /// Runs a Slurm client command (srun, sbatch, ...) as `who` in the work dir.
    pub fn slurm(&self, who: Submitter, program: &str, args: &[&str]) -> Run {
        self.slurm_env(who, program, args, &[])
    }

    /// The cluster's Slurm release as (major, minor), e.g. (24, 11), from
    /// `srun --version`.
    pub fn slurm_release(&self) -> (u32, u32) {
        let version = self.slurm(Submitter::Root, "srun", &["--version"]).stdout;
        let mut numbers = version
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .split('.')
            .map(|n| n.parse::<u32>().unwrap_or(0));
        (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
    }

    /// Like `slurm`, with extra environment variables.
    pub fn slurm_env(
        &self,
        who: Submitter,
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Run {
        let user = match who {
            Submitter::Root => "root",
            Submitter::User => TEST_USER,
        };
        let mut command = self.command_as(user, program, args);
        for (k, v) in env {
            command.env(k, v);
        }
        Run::from(
            command
                .output()
                .unwrap_or_else(|e| panic!("cannot run {program}: {e}")),
        )
    }

    /// `srun ARGS` as `who`, killed (exit 124) after `limit_s` seconds.
    pub fn srun_within(&self, who: Submitter, limit_s: u32, args: &[&str]) -> Run {
        let user = match who {
            Submitter::Root => "root",
            Submitter::User => TEST_USER,
        };
        let mut command = self.command_as_within(user, limit_s, "srun", args);
        Run::from(
            command
                .output()
                .unwrap_or_else(|e| panic!("cannot run srun: {e}")),
        )
    }

    /// A Slurm client command as `user` (a name; root runs it directly), in
    /// the work dir, with this cluster's `SLURM_CONF` and a 300 s limit.
    pub fn command_as(&self, user: &str, program: &str, args: &[&str]) -> Command {
        self.command_as_within(user, 300, program, args)
    }

    /// Like `command_as`, killed (exit 124) after `limit_s` seconds.
    pub fn command_as_within(
        &self,
        user: &str,
        limit_s: u32,
        program: &str,
        args: &[&str],
    ) -> Command {
        let mut command = if user == "root" {
            Command::new("timeout")
        } else {
            let mut c = Command::new("runuser");
            c.args(["-u", user, "--", "timeout"]);
            c
        };
        command
            .arg(limit_s.to_string())
            .arg(program)
            .args(args)
            .current_dir(self.var("BERTH_TEST_WORKDIR"))
            .env("SLURM_CONF", self.var("SLURM_CONF"))
            .env_remove("SLURM_JOB_ID")
            .env_remove("SLURM_JOBID");
        command
    }

    /// `srun ARGS` as `who`.
    pub fn srun(&self, who: Submitter, args: &[&str]) -> Run {
        self.slurm(who, "srun", args)
    }

    /// Node states as `name state` lines from sinfo.
    pub fn node_states(&self) -> Vec<(String, String)> {
        let run = self
            .slurm(Submitter::Root, "sinfo", &["-h", "-N", "-o", "%N %T"])
            .ok();
        run.stdout
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(n, s)| (n.to_string(), s.to_string()))
            .collect()
    }

    /// A fresh folder in the work dir that every node and user can write
    /// (mode 0777), named after `what`.
    pub fn shared_dir(&self, what: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::path::Path::new(&self.var("BERTH_TEST_WORKDIR")).join(format!(
            "shared-{what}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        dir
    }

    /// Asserts no node is drained, down or failing.
    pub fn assert_nodes_healthy(&self) {
        for (node, state) in self.node_states() {
            assert!(
                !["drain", "down", "fail", "not_responding"]
                    .iter()
                    .any(|bad| state.contains(bad)),
                "node {node} is {state}"
            );
        }
    }

    /// Whether slurmctld knows a job (pending, running or recently ended) by this name.
    pub fn job_exists(&self, name: &str) -> bool {
        let run = self.slurm(Submitter::Root, "scontrol", &["show", "jobs", "-o"]);
        run.stdout
            .lines()
            .any(|l| l.split_whitespace().any(|f| f == format!("JobName={name}")))
    }

    /// Number of GET requests for blobs of `repository` in the registry log.
    pub fn registry_blob_gets(&self, repository: &str) -> usize {
        let log = std::fs::read_to_string(self.var("BERTH_TEST_REGISTRY_LOG")).unwrap_or_default();
        let needle = format!("/v2/{repository}/blobs/sha256:");
        log.lines()
            .filter(|l| l.contains(&needle) && l.contains("\"GET "))
            .count()
    }
}

/// Lines of `losetup`, mount table and `ps` output that belong to berth, in
/// this cluster: its loop devices, the mounts in its nodes' (and this test's)
/// mount namespaces, its helper processes. Other clusters on the machine
/// (tests/run.sh runs the release roots' beside this one) are not looked at;
/// without a configured cluster, everything on the host is.
pub fn berth_leftovers() -> Vec<String> {
    let scope = Cluster::get().map(|c| Scope::of(&c));
    let mut found = Vec::new();
    let losetup = Command::new("losetup").arg("-a").output().expect("losetup");
    for line in String::from_utf8_lossy(&losetup.stdout).lines() {
        let berth = line.contains("berth") || line.contains(".sqfs");
        if berth && scope.as_ref().is_none_or(|s| s.names(line)) {
            found.push(format!("loop device: {line}"));
        }
    }
    let processes = processes();
    let own_ns = std::fs::read_link("/proc/self/ns/mnt").ok();
    let mut seen = std::collections::HashSet::new();
    for process in &processes {
        let ours = scope.as_ref().is_none_or(|s| s.owns(process, &processes));
        let own_ns = process.mnt_ns.is_some() && process.mnt_ns == own_ns;
        let helper =
            process.cmdline.contains("berth __holder") || process.cmdline.contains("squashfuse");
        if ours && helper {
            found.push(format!("process: {} {}", process.pid, process.cmdline));
        }
        if !ours && !own_ns {
            continue;
        }
        // Each mount namespace once: includes the slurmd nodes'.
        let Some(ns) = &process.mnt_ns else { continue };
        if !seen.insert(ns.clone()) {
            continue;
        }
        let Ok(mounts) = std::fs::read_to_string(format!("/proc/{}/mountinfo", process.pid)) else {
            continue;
        };
        for line in mounts.lines() {
            let berth_runtime = ["/run/berth", scope.as_ref().map_or("", |s| &s.runtime)]
                .iter()
                .filter(|dir| !dir.is_empty())
                .any(|dir| {
                    line.contains(&format!(" {dir}/"))
                        || line.contains(&format!(" {dir} "))
                        || line.contains(&format!("lowerdir={dir}/"))
                });
            let image_fs = line.contains(" - squashfs ")
                || line.contains("squashfuse")
                || line.contains("fuse-overlayfs");
            if berth_runtime || image_fs {
                found.push(format!("mount (pid {}): {line}", process.pid));
            }
        }
    }
    found
}

/// One process of the machine, as `/proc` shows it.
struct Process {
    pid: u32,
    ppid: u32,
    net_ns: Option<std::path::PathBuf>,
    mnt_ns: Option<std::path::PathBuf>,
    cmdline: String,
}

/// Every process now (those that end while being read are left out).
fn processes() -> Vec<Process> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let ppid = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        found.push(Process {
            pid,
            ppid,
            net_ns: std::fs::read_link(format!("/proc/{pid}/ns/net")).ok(),
            mnt_ns: std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok(),
            cmdline: String::from_utf8_lossy(&cmdline)
                .replace('\0', " ")
                .trim()
                .to_string(),
        });
    }
    found
}

/// What tells this cluster's processes and files from another cluster's.
struct Scope {
    /// The nodes' network namespaces (`net:[INODE]`).
    node_netns: Vec<std::path::PathBuf>,
    /// The cluster's state folder (node stores, work folder, prefix).
    state: String,
    /// The cluster's run folder (`/run/NAME/`: its configuration).
    run_dir: String,
    /// berth's runtime folder on the nodes (`/run/NAME/berth`, the
    /// plugstack's `runtime_path`).
    runtime: String,
}

impl Scope {
    fn of(cluster: &Cluster) -> Scope {
        let name = cluster.var("BERTH_TEST_NAME");
        let node_netns = cluster
            .var("BERTH_TEST_NODE_NAMES")
            .split(',')
            .filter_map(|node| {
                let meta = std::fs::metadata(format!("/var/run/netns/{name}-{node}")).ok()?;
                let inode = std::os::unix::fs::MetadataExt::ino(&meta);
                Some(format!("net:[{inode}]").into())
            })
            .collect();
        Scope {
            node_netns,
            state: format!("{}/", cluster.var("BERTH_TEST_STATE_DIR")),
            run_dir: format!("/run/{name}/"),
            runtime: format!("/run/{name}/berth"),
        }
    }

    /// Whether `text` (a command line, a loop device's backing file) names
    /// this cluster's files.
    fn names(&self, text: &str) -> bool {
        text.contains(&self.state) || text.contains(&self.run_dir)
    }

    /// Whether `process` runs for this cluster: in a node's network
    /// namespace, started from this cluster's files, or a descendant of such
    /// a process (a container with a network namespace of its own).
    fn owns(&self, process: &Process, all: &[Process]) -> bool {
        let mut current = Some(process);
        for _ in 0..64 {
            let Some(p) = current else { return false };
            let in_node = p
                .net_ns
                .as_ref()
                .is_some_and(|ns| self.node_netns.contains(ns));
            if in_node || self.names(&p.cmdline) {
                return true;
            }
            if p.ppid <= 1 {
                return false;
            }
            current = all.iter().find(|q| q.pid == p.ppid);
        }
        false
    }
}

/// Waits until `check` holds or `timeout` passes; returns whether it held.
pub fn wait_for(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    check()
}

/// A copy of `binary` in a folder every user can read (`/var/tmp/berth-test-bin`),
/// for running it as the ordinary test user: the checkout itself may sit under
/// a private home folder. Copied once per test process.
pub fn world_readable_copy(binary: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Mutex;
    static COPIED: Mutex<Vec<(std::path::PathBuf, std::path::PathBuf)>> = Mutex::new(Vec::new());
    let mut copied = COPIED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, copy)) = copied.iter().find(|(b, _)| b == binary) {
        return copy.clone();
    }
    let base = std::path::Path::new("/var/tmp/berth-test-bin");
    std::fs::create_dir_all(base).expect("create /var/tmp/berth-test-bin");
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755)).unwrap();
    if copied.is_empty() {
        // Copies of test processes that have ended.
        for entry in std::fs::read_dir(base).into_iter().flatten().flatten() {
            let pid = entry.file_name().to_string_lossy().into_owned();
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = base.join(std::process::id().to_string());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let target = dir.join(binary.file_name().expect("binary has a file name"));
    std::fs::copy(binary, &target).unwrap_or_else(|e| panic!("copy {}: {e}", binary.display()));
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
    copied.push((binary.to_path_buf(), target.clone()));
    target
}

/// `command.output()`, retried while the kernel answers ETXTBSY: a binary
/// copied a moment ago may still be open for writing in a child another test
/// thread forked during the copy (until that child execs).
pub fn output_of(command: &mut Command) -> Output {
    for _ in 0..50 {
        match command.output() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            result => return result.unwrap_or_else(|e| panic!("cannot run {command:?}: {e}")),
        }
    }
    panic!("{command:?}: text file busy for a second");
}

/// Copies `from` to `to` (`host:port/repo:tag`) between plain-HTTP registries.
pub fn skopeo_copy(from: &str, to: &str) {
    let mut c = Command::new("skopeo");
    c.args([
        "copy",
        "-q",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
    ]);
    c.arg(format!("docker://{from}"))
        .arg(format!("docker://{to}"));
    let out = output_of(&mut c);
    assert!(
        out.status.success(),
        "skopeo copy {from} {to}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `program args`, which must succeed; its stdout, trimmed.
pub fn tool(program: &str, args: &[&str]) -> String {
    let out = output_of(Command::new(program).args(args));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Pushes `source` (`host:port/repo:tag` in a plain-HTTP registry) to
/// `target` with `env` (`NAME=value`) added to its configuration, so under a
/// manifest digest no node has seen; `creds` (`user:password`) for the
/// target registry. Returns that digest.
pub fn push_with_env(source: &str, env: &str, target: &str, creds: Option<&str>) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let layout = format!("{}:x", tmp.path().join("oci").display());
    let oci = format!("oci:{layout}");
    tool(
        "skopeo",
        &[
            "copy",
            "-q",
            "--src-tls-verify=false",
            &format!("docker://{source}"),
            &oci,
        ],
    );
    tool(
        "umoci",
        &["config", "--image", &layout, "--config.env", env],
    );
    let target = format!("docker://{target}");
    // The digest from the push itself: an inspect would fetch the config
    // blob, which tests counting the registry's blob requests would see.
    let digest_file = tmp.path().join("digest");
    let digest_file = digest_file.to_str().unwrap();
    let mut push = vec![
        "copy",
        "-q",
        "--dest-tls-verify=false",
        "--digestfile",
        digest_file,
    ];
    if let Some(creds) = creds {
        push.extend(["--dest-creds", creds]);
    }
    push.extend([oci.as_str(), target.as_str()]);
    tool("skopeo", &push);
    let digest = std::fs::read_to_string(digest_file)
        .unwrap()
        .trim()
        .to_string();
    assert!(digest.starts_with("sha256:"), "{target}: {digest}");
    digest
}

/// Chowns `path` to the test user when `who` is that user.
pub fn give_to(who: Submitter, path: &std::path::Path) {
    if who == Submitter::User {
        let out = std::process::Command::new("chown")
            .arg(format!("{}:", TEST_USER))
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "chown {}: {out:?}", path.display());
    }
}

/// Builds, as `enroot import` lays a root out, a squashfs file at `file`:
/// the host's static busybox, `/etc/environment` and an `/etc/rc` whose
/// working directory, ENTRYPOINT and CMD are quoted as enroot quotes them.
pub fn enroot_layout_file(file: &std::path::Path, tools: &str) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    for sub in ["bin", "etc", "tmp", "opt/app work", &format!("{tools}/bin")] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    for applet in ["sh", "echo", "pwd", "cat", "env"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(
        root.join("etc/environment"),
        format!("PATH={tools}/bin:/bin\nBERTH_TEST_ENV=\"from-enroot-file\"\n"),
    )
    .unwrap();
    let rc = r#"# enroot-provenance: docker://registry.example#team/app:1
# org.example.label some value

mkdir -p "/opt/app work" 2> /dev/null
cd "/opt/app work" && unset OLDPWD || exit 1

if [ -s /etc/rc.local ]; then
    . /etc/rc.local
fi

if [ $# -gt 0 ]; then
    exec '/bin/sh' '-c' 'export BERTH_ENTRYPOINT_RAN="it'\''s-enroots"; exec "$@"' 'entry' "$@"
else
    exec '/bin/sh' '-c' 'export BERTH_ENTRYPOINT_RAN="it'\''s-enroots"; exec "$@"' 'entry' '/bin/sh'
fi
"#;
    std::fs::write(root.join("etc/rc"), rc).unwrap();
    let out = std::process::Command::new("gensquashfs")
        .arg("--pack-dir")
        .arg(&root)
        .args(["--quiet", "--force"])
        .arg(file)
        .output()
        .unwrap();
    assert!(out.status.success(), "gensquashfs: {out:?}");
}

/// The cluster's plugstack line with more keys until dropped (tests that
/// change it hold their file's lock, so one runs at a time).
pub struct PlugstackKeys {
    file: std::path::PathBuf,
    original: String,
}

impl PlugstackKeys {
    /// Adds `keys` (`key=value ...`) to the end of the line.
    pub fn add(cluster: &Cluster, keys: &str) -> PlugstackKeys {
        let file =
            std::path::Path::new(&cluster.var("BERTH_TEST_PLUGSTACK_DIR")).join("berth.conf");
        let original =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        replace_atomically(&file, &format!("{} {keys}\n", original.trim_end()));
        PlugstackKeys { file, original }
    }
}

impl Drop for PlugstackKeys {
    fn drop(&mut self) {
        replace_atomically(&self.file, &self.original);
    }
}

/// Writes `text` to `file` through a rename: Slurm never reads half a line.
pub fn replace_atomically(file: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    let temp = file.with_extension("conf-new");
    std::fs::write(&temp, text).unwrap();
    std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::rename(&temp, file).unwrap();
}

/// The uid of `user` (one of the users tests/harness/install-deps.sh makes).
pub fn uid_of_user(user: &str) -> u32 {
    nix::unistd::User::from_name(user)
        .unwrap()
        .unwrap_or_else(|| panic!("user {user} does not exist (tests/harness/install-deps.sh)"))
        .uid
        .as_raw()
}
