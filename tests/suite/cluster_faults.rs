//! Faults injected on the real test cluster, each with its outcome checked:
//! a killed puller or container helper, a registry that is down, stalls,
//! answers 500 or 429, truncates or corrupts a blob, a full store, steps
//! cancelled, signalled or out of time, and 16 steps of five users at once.
//!
//! Registry faults come from tests/harness/fault-proxy.py, which sits in front
//! of the anonymous test registry and breaks the requests of one repository
//! as a test asks. Every image is pushed fresh (layers with content of their
//! own), so each test's pull really downloads. After each fault: the step's
//! error names the image and what failed, nothing berth made is left (mount,
//! loop device, helper process, held lock, temp file, half image), and no node
//! is drained. The tests change shared node state (mounts, the plugstack
//! drop-in, processes they kill), so they run one at a time.

use crate::common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::proxy::ForwardProxy;
use common::{wait_for, Cluster, Run};

/// One test at a time (see the module comment).
static SERIAL: Mutex<()> = Mutex::new(());

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// A command no other process on the nodes runs, to find the test's tasks.
const MARKER_SLEEP: &str = "7777";

/// The cluster, the fault proxy and the berth installation it runs.
struct Faults {
    cluster: Cluster,
    _serial: MutexGuard<'static, ()>,
}

/// An image pushed for one test.
struct Pushed {
    /// `host:port/repository:tag` through the fault proxy.
    via_proxy: String,
    /// The repository (the proxy's rules and logs are per repository).
    repository: String,
    /// Digests of its layers, lowest first.
    layers: Vec<String>,
    /// Digest of its config blob.
    config: String,
}

impl Faults {
    fn get() -> Option<Faults> {
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let cluster = Cluster::get()?;
        Some(Faults {
            cluster,
            _serial: serial,
        })
    }

    fn var(&self, name: &str) -> String {
        self.cluster.var(name)
    }

    fn proxy(&self) -> String {
        self.var("BERTH_TEST_FAULT_PROXY")
    }

    fn berth(&self) -> String {
        format!("{}/prefix/bin/berth", self.var("BERTH_TEST_STATE_DIR"))
    }

    fn store(&self, node: &str) -> PathBuf {
        PathBuf::from(format!(
            "{}/nodes/{node}/berth-store",
            self.var("BERTH_TEST_STATE_DIR")
        ))
    }

    /// A repository name no earlier run used.
    fn repository(&self, what: &str) -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        format!("faults/{what}-{}-{nanos}", std::process::id())
    }

    /// A Slurm command as `user`, from the work dir, with a 300 s limit.
    fn command_as(&self, user: &str, program: &str, args: &[&str]) -> Command {
        self.cluster.command_as(user, program, args)
    }

    fn run_as(&self, user: &str, program: &str, args: &[&str]) -> Run {
        let out = common::output_of(&mut self.command_as(user, program, args));
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    fn srun(&self, args: &[&str]) -> Run {
        self.run_as("root", "srun", args)
    }

    /// srun in the background, as root, output captured.
    fn spawn_srun(&self, args: &[&str]) -> Child {
        self.spawn_srun_as("root", args)
    }

    /// srun in the background, as `user`, output captured.
    fn spawn_srun_as(&self, user: &str, args: &[&str]) -> Child {
        self.command_as(user, "srun", args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start srun")
    }

    // ---------------------------------------------------------------- images

    /// The registry's busybox layer, uncompressed (a tar).
    fn busybox_tar(&self) -> Vec<u8> {
        let registry = self.cluster.registry();
        let manifest: serde_json::Value =
            ureq::get(&format!("http://{registry}/v2/busybox/manifests/latest"))
                .set("Accept", MANIFEST_TYPE)
                .call()
                .expect("busybox:latest in the test registry")
                .into_json()
                .unwrap();
        let digest = manifest["layers"][0]["digest"].as_str().unwrap();
        let mut gz = Vec::new();
        ureq::get(&format!("http://{registry}/v2/busybox/blobs/{digest}"))
            .call()
            .unwrap()
            .into_reader()
            .read_to_end(&mut gz)
            .unwrap();
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut tar)
            .unwrap();
        tar
    }

    /// Pushes an image whose layers are busybox plus a file of its own (so
    /// no store has it), then `extra` layers; returns its names and digests.
    fn push_image(
        &self,
        repository: &str,
        tag: &str,
        base: &[u8],
        extra: &[Vec<u8>],
        entrypoint: Option<&[&str]>,
    ) -> Pushed {
        let mut layers = vec![base.to_vec()];
        layers.extend(extra.iter().cloned());
        let registry = self.cluster.registry();
        let mut descriptors = Vec::new();
        let mut diff_ids = Vec::new();
        for layer in &layers {
            let mut tar = Vec::new();
            flate2::read::GzDecoder::new(&layer[..])
                .read_to_end(&mut tar)
                .unwrap();
            diff_ids.push(sha256(&tar));
            let digest = push_blob(&registry, repository, layer);
            descriptors.push(serde_json::json!({
                "mediaType": LAYER_TYPE, "digest": digest, "size": layer.len()
            }));
        }
        let mut config = serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        if let Some(entrypoint) = entrypoint {
            config["config"]["Entrypoint"] = serde_json::json!(entrypoint);
        }
        let config = serde_json::to_vec(&config).unwrap();
        let config_digest = push_blob(&registry, repository, &config);
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": config.len()},
            "layers": descriptors,
        });
        ureq::put(&format!(
            "http://{registry}/v2/{repository}/manifests/{tag}"
        ))
        .set("Content-Type", MANIFEST_TYPE)
        .send_bytes(&serde_json::to_vec(&manifest).unwrap())
        .expect("manifest push");
        Pushed {
            via_proxy: format!("{}/{repository}:{tag}", self.proxy()),
            repository: repository.to_string(),
            layers: descriptors
                .iter()
                .map(|d| d["digest"].as_str().unwrap().to_string())
                .collect(),
            config: config_digest,
        }
    }

    /// A fresh busybox image with one layer (busybox and a file of its own).
    fn fresh_image(&self, what: &str) -> Pushed {
        let repository = self.repository(what);
        let base = busybox_layer(&self.busybox_tar(), &repository);
        self.push_image(&repository, "t", &base, &[], None)
    }

    // ---------------------------------------------------------------- proxy

    /// Sets the fault rule of `pushed`'s repository (see fault-proxy.py).
    fn fault(&self, pushed: &Pushed, mut rule: serde_json::Value) {
        rule["repository"] = serde_json::json!(pushed.repository);
        ureq::post(&format!("http://{}/_fault/rules", self.proxy()))
            .send_json(rule)
            .expect("fault proxy rule");
    }

    fn clear_fault(&self, pushed: &Pushed) {
        ureq::delete(&format!("http://{}/_fault/rules", self.proxy()))
            .query("repository", &pushed.repository)
            .call()
            .expect("fault proxy rule removal");
    }

    /// The requests the proxy saw for `pushed`'s repository.
    fn proxy_log(&self, pushed: &Pushed) -> Vec<serde_json::Value> {
        ureq::get(&format!("http://{}/_fault/log", self.proxy()))
            .query("repository", &pushed.repository)
            .call()
            .expect("fault proxy log")
            .into_json()
            .unwrap()
    }

    // ---------------------------------------------------------------- checks

    /// What a store holds that a failed pull must not change: images and
    /// blobs, each with its size, and the temp folder's entries.
    fn store_listing(&self, node: &str) -> Vec<String> {
        let root = self.store(node);
        let mut listing = Vec::new();
        for sub in ["images", "blobs/sha256", "tmp"] {
            let dir = root.join(sub);
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let size = common_tree_size(&entry.path());
                listing.push(format!(
                    "{sub}/{} {size}",
                    entry.file_name().to_string_lossy()
                ));
            }
        }
        listing.sort();
        listing
    }

    /// Entries of a node store's `tmp/`.
    fn temp_entries(&self, node: &str) -> Vec<String> {
        std::fs::read_dir(self.store(node).join("tmp"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Lock files of a node store that someone holds.
    fn held_locks(&self, node: &str) -> Vec<String> {
        let mut held = Vec::new();
        let dir = self.store(node).join("locks");
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let file = std::fs::File::open(entry.path()).unwrap();
            // SAFETY: flock on a descriptor we own; no memory is passed.
            let rc = unsafe {
                libc::flock(
                    std::os::fd::AsRawFd::as_raw_fd(&file),
                    libc::LOCK_EX | libc::LOCK_NB,
                )
            };
            if rc != 0 {
                held.push(entry.path().display().to_string());
            }
        }
        held
    }

    /// `berth images` of a node store.
    fn images(&self, node: &str) -> String {
        let out = Command::new(self.berth())
            .args(["images", "--store"])
            .arg(self.store(node))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "berth images: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The inodes of the nodes' network namespaces.
    fn node_netns(&self) -> Vec<std::ffi::OsString> {
        let name = self.var("BERTH_TEST_NAME");
        let nodes = self.var("BERTH_TEST_NODE_NAMES");
        nodes
            .split(',')
            .filter_map(|node| {
                let path = format!("/var/run/netns/{name}-{node}");
                let meta = std::fs::metadata(path).ok()?;
                Some(format!("net:[{}]", std::os::unix::fs::MetadataExt::ino(&meta)).into())
            })
            .collect()
    }

    /// Processes in the nodes' network namespaces: `(pid, command line)`.
    fn node_processes(&self) -> Vec<(u32, String)> {
        let netns = self.node_netns();
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/net")) else {
                continue;
            };
            if !netns.contains(&ns.into_os_string()) {
                continue;
            }
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push((pid, cmdline.trim().to_string()));
        }
        found
    }

    /// Pids of node processes whose command line contains `needle`.
    fn pids_of(&self, needle: &str) -> Vec<u32> {
        self.node_processes()
            .into_iter()
            .filter(|(_, c)| c.contains(needle))
            .map(|(p, _)| p)
            .collect()
    }

    /// What berth left on the nodes: processes (helpers, pulls, the tests'
    /// marker tasks), squashfs/overlay/FUSE mounts in the nodes' processes,
    /// loop devices backed by this cluster's stores, held store locks.
    fn leftovers(&self) -> Vec<String> {
        let mut found = Vec::new();
        let state = self.var("BERTH_TEST_STATE_DIR");
        for (pid, cmdline) in self.node_processes() {
            // By program name: the cluster's own paths may contain "berth".
            let program = cmdline
                .split(' ')
                .next()
                .and_then(|p| p.rsplit('/').next())
                .unwrap_or("");
            if matches!(
                program,
                "berth" | "tar2sqfs" | "squashfuse" | "fuse-overlayfs"
            ) || cmdline.contains(&format!("sleep {MARKER_SLEEP}"))
            {
                found.push(format!("process {pid}: {cmdline}"));
            }
            let mounts =
                std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
            for line in mounts.lines() {
                if line.contains(" - squashfs ")
                    || line.contains(" - overlay ")
                    || line.contains(" - fuse")
                {
                    found.push(format!("mount in pid {pid} ({cmdline}): {line}"));
                }
            }
        }
        let losetup = Command::new("losetup").arg("-a").output().unwrap();
        for line in String::from_utf8_lossy(&losetup.stdout).lines() {
            if line.contains(&state) {
                found.push(format!("loop device: {line}"));
            }
        }
        for node in self.var("BERTH_TEST_NODE_NAMES").split(',') {
            for lock in self.held_locks(node) {
                found.push(format!("held lock: {lock}"));
            }
        }
        found
    }

    /// Waits for the test's jobs to end, then asserts nothing is left and
    /// every node is idle without a reason (never drained by berth).
    fn assert_clean(&self, what: &str) {
        assert!(
            wait_for(Duration::from_secs(60), || self
                .run_as("root", "squeue", &["-h", "-o", "%i"])
                .stdout
                .trim()
                .is_empty()),
            "{what}: jobs still queued: {}",
            self.run_as("root", "squeue", &[]).stdout
        );
        let clean = wait_for(Duration::from_secs(30), || self.leftovers().is_empty());
        assert!(
            clean,
            "{what}: left behind:\n{}",
            self.leftovers().join("\n")
        );
        self.assert_nodes_idle(what);
    }

    /// A fresh folder of root's (mode 0755) under the cluster's state
    /// folder, named `label-PID`, for files root reads (config files,
    /// an enroot site).
    fn fresh_state_folder(&self, label: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = PathBuf::from(format!(
            "{}/{label}-{}",
            self.var("BERTH_TEST_STATE_DIR"),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    /// Waits (up to 30 s) until no job is left on `node`, its epilog
    /// included, then checks that no node is drained or down.
    fn assert_node_done_and_healthy(&self, node: &str) {
        assert!(
            wait_for(Duration::from_secs(30), || self
                .run_as("root", "squeue", &["-h", "-w", node])
                .stdout
                .trim()
                .is_empty()),
            "jobs stay on {node}"
        );
        self.cluster.assert_nodes_healthy();
    }

    /// Every node idle, with no reason set (`sinfo -N -o '%N %T %E'`), within
    /// 30 s: right after the queue empties the backfill scheduler may still
    /// show a node as `planned` for a job that has gone; a drained or failed
    /// node stays so.
    fn assert_nodes_idle(&self, what: &str) {
        let sinfo = || {
            self.run_as("root", "sinfo", &["-h", "-N", "-o", "%N %T %E"])
                .ok()
        };
        let idle = |out: &str| {
            out.lines().all(|line| {
                let fields: Vec<&str> = line.splitn(3, ' ').collect();
                fields.len() == 3 && fields[1] == "idle" && fields[2] == "none"
            })
        };
        wait_for(Duration::from_secs(30), || idle(&sinfo().stdout));
        let run = sinfo();
        for line in run.stdout.lines() {
            let fields: Vec<&str> = line.splitn(3, ' ').collect();
            assert!(
                fields.len() == 3 && fields[1] == "idle" && fields[2] == "none",
                "{what}: node not idle or with a reason: {line}\n{}",
                run.stdout
            );
        }
    }

    /// Pushes a fresh image whose lowest layer stalls after 64 KiB, starts
    /// `srun -w NODE [ARGS] --container-image=IT true` and returns once the
    /// node's puller is inside that stalled download.
    fn spawn_stalled_pull(&self, node: &str, what: &str, args: &[&str]) -> (Pushed, Child) {
        let image = self.fresh_image(what);
        self.fault(
            &image,
            serde_json::json!({"fault": "stall", "digest": image.layers[0], "after_bytes": 65536}),
        );
        let option = format!("--container-image={}", image.via_proxy);
        let mut srun_args = vec!["-w", node];
        srun_args.extend_from_slice(args);
        srun_args.extend([option.as_str(), "true"]);
        let srun = self.spawn_srun(&srun_args);
        assert!(
            wait_for(Duration::from_secs(30), || !self
                .pids_of("berth __pull")
                .is_empty()
                && self
                    .proxy_log(&image)
                    .iter()
                    .any(|l| l["action"] == "stall")),
            "the pull never reached the stalled blob"
        );
        (image, srun)
    }

    /// Lifts `image`'s fault, runs a step with it on `node` and asserts that
    /// the pull swept the temp files an interrupted one left.
    fn assert_next_pull_runs_and_sweeps(&self, node: &str, image: &Pushed) {
        self.clear_fault(image);
        self.srun(&[
            "-w",
            node,
            &format!("--container-image={}", image.via_proxy),
            "true",
        ])
        .ok();
        assert!(
            self.temp_entries(node).is_empty(),
            "temp files not swept: {:?}",
            self.temp_entries(node)
        );
    }

    /// Asserts srun failed and its error names the image and `expected`.
    fn assert_failed_with(&self, run: Run, image: &str, expected: &[&str]) -> Run {
        let run = run.failed();
        let text = format!("{}\n{}", run.stdout, run.stderr);
        assert!(
            text.contains(image),
            "the error does not name the image {image}:\n{text}"
        );
        for e in expected {
            assert!(
                text.to_lowercase().contains(&e.to_lowercase()),
                "the error does not say '{e}':\n{text}"
            );
        }
        run
    }
}

/// Writes extra plugstack arguments into the cluster's drop-in while alive;
/// slurmstepd reads it for each new step.
struct PlugstackArgs {
    path: PathBuf,
    original: String,
}

impl PlugstackArgs {
    fn add(faults: &Faults, args: &str) -> PlugstackArgs {
        let dir = faults.var("BERTH_TEST_PLUGSTACK_DIR");
        let path = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                std::fs::read_to_string(p)
                    .map(|t| t.contains("spank_berth.so"))
                    .unwrap_or(false)
            })
            .unwrap_or_else(|| panic!("no berth drop-in in {dir}"));
        let original = std::fs::read_to_string(&path).unwrap();
        let changed: String = original
            .lines()
            .map(|l| {
                if l.contains("spank_berth.so") {
                    format!("{l} {args}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        std::fs::write(&path, changed).unwrap();
        PlugstackArgs { path, original }
    }
}

impl Drop for PlugstackArgs {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, &self.original);
    }
}

/// Pushes a blob (monolithic upload); returns its digest.
fn push_blob(registry: &str, repository: &str, bytes: &[u8]) -> String {
    let digest = format!("sha256:{}", sha256(bytes));
    let started = ureq::post(&format!("http://{registry}/v2/{repository}/blobs/uploads/"))
        .call()
        .expect("blob upload start");
    let location = started.header("location").unwrap().to_string();
    let location = if location.starts_with("http") {
        location
    } else {
        format!("http://{registry}{location}")
    };
    let separator = if location.contains('?') { '&' } else { '?' };
    ureq::put(&format!("{location}{separator}digest={digest}"))
        .set("Content-Type", "application/octet-stream")
        .send_bytes(bytes)
        .expect("blob upload");
    digest
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(bytes);
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

fn gzip(tar: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(tar).unwrap();
    gz.finish().unwrap()
}

/// busybox's layer with one more file, `/etc/berth-fault`, naming `marker`:
/// a layer no store has seen.
fn busybox_layer(busybox_tar: &[u8], marker: &str) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut archive = tar::Archive::new(busybox_tar);
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let mut header = entry.header().clone();
        let path = entry.path().unwrap().into_owned();
        match header.entry_type() {
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = entry.link_name().unwrap().unwrap().into_owned();
                builder.append_link(&mut header, &path, &target).unwrap();
            }
            _ => builder.append_data(&mut header, &path, &mut entry).unwrap(),
        }
    }
    append_file(&mut builder, "etc/berth-fault", marker.as_bytes());
    gzip(&builder.into_inner().unwrap())
}

/// A layer with one file of `content` at `path`.
fn file_layer(path: &str, content: &[u8]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    append_file(&mut builder, path, content);
    gzip(&builder.into_inner().unwrap())
}

fn append_file(builder: &mut tar::Builder<Vec<u8>>, path: &str, content: &[u8]) {
    let mut header = tar::Header::new_gnu();
    header.set_size(content.len() as u64);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    builder.append_data(&mut header, path, content).unwrap();
}

/// `n` bytes that do not compress (xorshift), different for each `seed`
/// and each run (the seed is mixed with the time).
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut x = (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ now) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

fn common_tree_size(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path)
        .map(|d| d.flatten().map(|e| common_tree_size(&e.path())).sum())
        .unwrap_or(0)
}

/// Waits for a background srun; returns what it printed.
fn finish(child: Child) -> Run {
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn kill(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) with a pid and a signal number; no memory is passed.
    unsafe { libc::kill(pid as libc::pid_t, signal) };
}

/// The id of the job named `name`, once it is known to Slurm.
fn job_id(faults: &Faults, name: &str) -> String {
    let mut id = String::new();
    assert!(
        wait_for(Duration::from_secs(30), || {
            id = faults
                .run_as("root", "squeue", &["-h", "-n", name, "-o", "%i"])
                .stdout
                .trim()
                .to_string();
            !id.is_empty()
        }),
        "job {name} never appeared"
    );
    id
}

// ==================================================================== tests

/// 500s and 429s that stop: retried (Retry-After honoured), the step runs.
#[test]
fn transient_500_and_429_are_retried() {
    let Some(f) = Faults::get() else { return };
    let image = f.fresh_image("transient");
    f.fault(
        &image,
        serde_json::json!({"fault": "status", "status": 500, "what": "blobs", "times": 2}),
    );
    f.srun(&[
        "-w",
        "node1",
        &format!("--container-image={}", image.via_proxy),
        "true",
    ])
    .ok();
    let log = f.proxy_log(&image);
    let blob_statuses: Vec<u64> = log
        .iter()
        .filter(|l| l["path"].as_str().unwrap().contains("/blobs/"))
        .map(|l| l["status"].as_u64().unwrap())
        .collect();
    assert_eq!(
        blob_statuses.iter().filter(|s| **s == 500).count(),
        2,
        "{log:?}"
    );
    assert!(blob_statuses.contains(&200), "{log:?}");

    let image = f.fresh_image("ratelimit");
    f.fault(
        &image,
        serde_json::json!({"fault": "status", "status": 429, "retry_after": 2, "what": "manifests", "times": 1}),
    );
    f.srun(&[
        "-w",
        "node1",
        &format!("--container-image={}", image.via_proxy),
        "true",
    ])
    .ok();
    let log = f.proxy_log(&image);
    let manifests: Vec<&serde_json::Value> = log
        .iter()
        .filter(|l| l["path"].as_str().unwrap().contains("/manifests/"))
        .collect();
    assert_eq!(manifests[0]["status"], 429, "{log:?}");
    let waited = manifests[1]["time"].as_f64().unwrap() - manifests[0]["time"].as_f64().unwrap();
    assert!(
        waited >= 1.9,
        "Retry-After: 2 not honoured: {waited:.2} s ({log:?})"
    );
    f.assert_clean("transient faults");
}

/// Faults that stay: a clear error naming the image and the failure, the
/// store as it was, nothing left, no node drained.
#[test]
fn persistent_registry_faults_fail_clearly() {
    let Some(f) = Faults::get() else { return };
    let _fast = PlugstackArgs::add(&f, "registry_retries=1");
    let node = "node1";
    // Every fault: (name, rule, words the error must contain).
    let cases: Vec<(&str, serde_json::Value, Vec<&str>)> = vec![
        (
            "http500",
            serde_json::json!({"fault": "status", "status": 500, "what": "blobs"}),
            vec!["HTTP 500"],
        ),
        (
            "http429",
            serde_json::json!({"fault": "status", "status": 429, "retry_after": 1, "what": "manifests"}),
            vec!["HTTP 429"],
        ),
        (
            "reset",
            serde_json::json!({"fault": "reset", "what": "blobs"}),
            vec!["cannot be reached"],
        ),
        (
            "truncated",
            serde_json::json!({"fault": "truncate", "what": "blobs", "digest": "LAYER"}),
            vec!["connection lost while downloading blob"],
        ),
        (
            "corrupt",
            serde_json::json!({"fault": "corrupt", "what": "blobs", "digest": "LAYER", "after_bytes": 1000}),
            vec!["does not match its digest"],
        ),
    ];
    for (what, mut rule, expected) in cases {
        let image = f.fresh_image(what);
        if rule.get("digest").is_some() {
            rule["digest"] = serde_json::json!(image.layers[0]);
        }
        f.fault(&image, rule);
        let before = f.store_listing(node);
        let run = f.srun(&[
            "-w",
            node,
            &format!("--container-image={}", image.via_proxy),
            "true",
        ]);
        let mut expected = expected.clone();
        if what == "truncated" || what == "corrupt" {
            expected.push(&image.layers[0]);
        }
        f.assert_failed_with(run, &image.via_proxy, &expected);
        assert_eq!(before, f.store_listing(node), "{what}: the store changed");
        assert!(!f.images(node).contains(&image.repository), "{what}");
        f.assert_clean(what);
        f.clear_fault(&image);
    }
    // Down: nothing listens on the port.
    let down = format!("{}:9/faults/down:t", f.var("BERTH_TEST_BRIDGE_IP"));
    let before = f.store_listing(node);
    let run = f.srun(&["-w", node, &format!("--container-image={down}"), "true"]);
    f.assert_failed_with(run, &down, &["cannot be reached", "connection"]);
    assert_eq!(before, f.store_listing(node));
    f.assert_clean("registry down");
}

/// A truncated blob once is downloaded again; the step runs.
#[test]
fn truncated_blob_once_is_downloaded_again() {
    let Some(f) = Faults::get() else { return };
    let image = f.fresh_image("truncate-once");
    f.fault(
        &image,
        serde_json::json!({"fault": "truncate", "digest": image.layers[0], "times": 1}),
    );
    f.srun(&[
        "-w",
        "node2",
        &format!("--container-image={}", image.via_proxy),
        "true",
    ])
    .ok();
    let fetches = f
        .proxy_log(&image)
        .iter()
        .filter(|l| l["path"].as_str().unwrap().ends_with(&image.layers[0]))
        .count();
    assert_eq!(fetches, 2, "one truncated download, one whole");
    f.assert_clean("truncated once");
}

/// A berth setting that only slurmstepd refuses (here the line's config
/// file is the user's: srun, run by that user, reads it, and root never
/// does) fails the container step with berth's message and drains no node,
/// on every release: slurmstepd's `slurm_spank_init` does not fail for it
/// (before 25.05 that would drain the node), the step's `user_init` does,
/// and a bare step on the same node runs. The job's epilog, which reads
/// the same line, leaves the node in service too.
#[test]
fn a_setting_slurmstepd_refuses_fails_the_job_and_drains_no_node() {
    let Some(f) = Faults::get() else { return };
    let node = "node2";
    let dir = f.fresh_state_folder("init-failure");
    let conf = dir.join("users.conf");
    std::fs::write(&conf, "registry_retries=0\n").unwrap();
    let user = common::TEST_USER;
    let uid = nix::unistd::User::from_name(user).unwrap().unwrap().uid;
    std::os::unix::fs::chown(&conf, Some(uid.as_raw()), None).unwrap();
    let line = PlugstackArgs::add(&f, &format!("config={}", conf.display()));
    let image = f.cluster.image("busybox:latest");
    let run = f.run_as(
        user,
        "srun",
        &["-w", node, &format!("--container-image={image}"), "true"],
    );
    assert_ne!(run.code, 0, "the step ran: {}{}", run.stdout, run.stderr);
    let shown = format!("{}{}", run.stdout, run.stderr);
    assert!(
        shown.contains(&conf.display().to_string()) && shown.contains("it is not root's"),
        "srun does not say which setting failed: {shown}"
    );
    let bare = f.run_as(user, "srun", &["-w", node, "echo", "bare-ran"]);
    assert!(
        bare.code == 0 && bare.stdout.contains("bare-ran"),
        "a bare step failed with the broken setting: {}{}",
        bare.stdout,
        bare.stderr
    );
    drop(line);
    f.assert_node_done_and_healthy(node);
    f.srun(&["-w", node, &format!("--container-image={image}"), "true"])
        .ok();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A registry that accepts and then says nothing: the pull times out
/// (registry_timeout) instead of hanging, with a clear error.
/// The pull helper pulls with the plugin's settings and nothing else: the
/// plugstack line names its config file (`config=`), turns off a shared
/// store (`store_shared=0`) and gives a shorter `insecure_registries` than a
/// config file the helper could read for itself (here the helper is started
/// with `BERTH_CONFIG` naming such a file, as `/etc/berth/berth.conf` would be
/// read; the machine's own /etc is left alone). The registry the line leaves
/// out is not reached over plain HTTP, and the store is used as a node-local
/// one.
#[test]
fn the_pull_helper_uses_the_plugins_settings_only() {
    use std::os::unix::fs::PermissionsExt;
    let Some(f) = Faults::get() else { return };
    let node = "node1";
    let dir = f.fresh_state_folder("config-test");
    let write = |name: &str, text: &str, mode: u32| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    };
    let registry = f.cluster.registry();
    let site = write("site.conf", "registry_retries=0\n", 0o644);
    let other = write(
        "other.conf",
        &format!(
            "insecure_registries={},{registry}\nstore_shared=1\nregistry_retries=0\n",
            f.proxy()
        ),
        0o644,
    );
    let helper = write(
        "berth",
        &format!(
            "#!/bin/sh\nBERTH_CONFIG={} exec {} \"$@\"\n",
            other.display(),
            f.berth()
        ),
        0o755,
    );
    let store = dir.join(format!("store-{node}"));
    let line = PlugstackArgs::add(
        &f,
        &format!(
            "config={} helper_path={} store_path={}/store-%n store_shared=0 \
             insecure_registries={registry}",
            site.display(),
            helper.display(),
            dir.display()
        ),
    );
    // In the line's list: pulled, into a node-local store (a shared one has
    // the `shared-store` marker, which the pull user cannot write: the
    // pull failed with the helper's own config file).
    let image = f.cluster.image("busybox:latest");
    f.srun(&[
        "-w",
        node,
        &format!("--container-image={image}"),
        "cat",
        "/etc/os-release",
    ])
    .ok();
    assert!(
        store.join("images").is_dir(),
        "nothing in {}",
        store.display()
    );
    let per_host: Vec<_> = std::fs::read_dir(store.join("tmp"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.path())
        .collect();
    assert!(
        !store.join("shared-store").exists() && per_host.is_empty(),
        "the pull used {} as a shared store: {per_host:?}",
        store.display()
    );
    // Left out by the line: HTTPS, which the plain-HTTP proxy does not speak.
    let pushed = f.fresh_image("config-https");
    let run = f.srun(&[
        "-w",
        node,
        &format!("--container-image={}", pushed.via_proxy),
        "true",
    ]);
    f.assert_failed_with(run, &pushed.via_proxy, &[]);
    assert!(
        f.proxy_log(&pushed).is_empty(),
        "the proxy saw plain HTTP requests for {}",
        pushed.repository
    );
    // The job epilogs read the line too: remove its files after them.
    drop(line);
    f.assert_node_done_and_healthy(node);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stalled_registry_times_out() {
    let Some(f) = Faults::get() else { return };
    let _fast = PlugstackArgs::add(&f, "registry_timeout=2 registry_retries=1");
    let node = "node2";
    for (what, after_bytes) in [("stall-headers", 0), ("stall-body", 65536)] {
        let image = f.fresh_image(what);
        f.fault(
            &image,
            serde_json::json!({"fault": "stall", "digest": image.layers[0], "after_bytes": after_bytes}),
        );
        let before = f.store_listing(node);
        let started = Instant::now();
        let run = f.srun(&[
            "-w",
            node,
            &format!("--container-image={}", image.via_proxy),
            "true",
        ]);
        let took = started.elapsed();
        // A stall in the body names the layer it was downloading.
        let expected: Vec<&str> = if after_bytes > 0 {
            vec![&image.layers[0]]
        } else {
            Vec::new()
        };
        let run = f.assert_failed_with(run, &image.via_proxy, &expected);
        let text = run.stderr.to_lowercase();
        assert!(
            text.contains("timed out") || text.contains("timeout"),
            "{what}: the error does not say it timed out:\n{}",
            run.stderr
        );
        assert!(took < Duration::from_secs(40), "{what}: took {took:?}");
        assert_eq!(before, f.store_listing(node), "{what}: the store changed");
        f.assert_clean(what);
        f.clear_fault(&image);
    }
}

/// kill -9 of `berth pull` in the middle of a download: the step fails and
/// says so, no lock stays held, no half image shows; the next step pulls
/// again and runs, and the dead pull's temp file is swept.
#[test]
fn killed_puller_leaves_nothing_behind() {
    let Some(f) = Faults::get() else { return };
    let node = "node1";
    let (image, srun) = f.spawn_stalled_pull(node, "killpull", &[]);
    for pid in &f.pids_of("berth __pull") {
        kill(*pid, libc::SIGKILL);
    }
    let run = f.assert_failed_with(finish(srun), &image.via_proxy, &["killed by signal 9"]);
    assert!(!run.stderr.is_empty());
    assert!(f.held_locks(node).is_empty(), "{:?}", f.held_locks(node));
    assert!(!f.images(node).contains(&image.repository));
    f.assert_next_pull_runs_and_sweeps(node, &image);
    assert_eq!(
        f.images(node).matches(&image.repository).count(),
        1,
        "{}",
        f.images(node)
    );
    f.assert_clean("killed puller");
}

/// kill -9 of the container helper while the image ENTRYPOINT runs at
/// setup, and of a running task: the step fails, the entrypoint does not
/// outlive its helper, nothing is left, the next step runs.
/// As root and as the user: the user's container has its own user
/// namespace and the helper drops to the user, so what is left differs.
#[test]
fn killed_helper_or_task_leaves_nothing_behind() {
    let Some(f) = Faults::get() else { return };
    for user in ["root", common::TEST_USER] {
        killed_helper_or_task_leaves_nothing_behind_as(&f, user);
    }
}

fn killed_helper_or_task_leaves_nothing_behind_as(f: &Faults, user: &str) {
    let node = "node2";
    let repository = f.repository("killholder");
    let base = busybox_layer(&f.busybox_tar(), &repository);
    let script = format!("sleep {MARKER_SLEEP}; exec \"$@\"");
    let image = f.push_image(
        &repository,
        "t",
        &base,
        &[],
        Some(&["/bin/sh", "-c", &script, "entrypoint"]),
    );
    let image_opt = format!("--container-image={}", image.via_proxy);
    let srun = f.spawn_srun_as(
        user,
        &["-w", node, "--container-entrypoint", &image_opt, "true"],
    );
    assert!(
        wait_for(Duration::from_secs(60), || !f
            .pids_of(&format!("sleep {MARKER_SLEEP}"))
            .is_empty()),
        "the entrypoint never started"
    );
    let holders = f.pids_of("berth __holder");
    assert!(!holders.is_empty(), "no container helper found");
    for pid in holders {
        kill(pid, libc::SIGKILL);
    }
    let run = finish(srun).failed();
    assert!(
        run.stderr.contains(&image.via_proxy) || run.stderr.contains("container"),
        "{user}: {}",
        run.stderr
    );
    f.assert_clean(&format!("{user}: killed container helper"));

    // A task killed while it runs.
    let srun = f.spawn_srun_as(user, &["-w", node, &image_opt, "sleep", MARKER_SLEEP]);
    assert!(
        wait_for(Duration::from_secs(60), || !f
            .pids_of(&format!("sleep {MARKER_SLEEP}"))
            .is_empty()),
        "the task never started"
    );
    for pid in f.pids_of(&format!("sleep {MARKER_SLEEP}")) {
        kill(pid, libc::SIGKILL);
    }
    finish(srun).failed();
    f.assert_clean(&format!("{user}: killed task"));
    f.run_as(user, "srun", &["-w", node, &image_opt, "true"])
        .ok();
    f.assert_clean(&format!("{user}: step after the kills"));
}

/// A store that fills up in the middle of a pull: a clear error (no space,
/// what to do), the store as it was, the space given back.
#[test]
fn full_store_fails_clearly_and_gives_space_back() {
    let Some(f) = Faults::get() else { return };
    let node = "node2";
    let store = f.store(node);
    let slurmd_pid = std::fs::read_to_string(format!(
        "{}/pid/slurmd-{node}.pid",
        f.var("BERTH_TEST_STATE_DIR")
    ))
    .unwrap()
    .trim()
    .to_string();
    // The node's mount namespace is its own (private propagation): mount there.
    let in_node = |args: &[&str]| {
        let out = Command::new("nsenter")
            .args(["-t", &slurmd_pid, "-m", "--"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let store_arg = store.to_str().unwrap();
    in_node(&[
        "mount",
        "-t",
        "tmpfs",
        "-o",
        "size=6m,mode=0755",
        "tmpfs",
        store_arg,
    ]);
    struct Unmount<'a>(&'a dyn Fn(&[&str]), &'a str);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            (self.0)(&["umount", self.1]);
        }
    }
    let _unmount = Unmount(&in_node, store_arg);
    let small = f.fresh_image("small");
    f.srun(&[
        "-w",
        node,
        &format!("--container-image={}", small.via_proxy),
        "true",
    ])
    .ok();
    let repository = f.repository("big");
    let base = busybox_layer(&f.busybox_tar(), &repository);
    let big = f.push_image(
        &repository,
        "t",
        &base,
        &[file_layer("big", &noise(8 << 20, 42))],
        None,
    );
    // The store as the node sees it.
    let listing = || {
        let out = Command::new("nsenter")
            .args(["-t", &slurmd_pid, "-m", "--", "find", store_arg, "-path"])
            .arg(format!("{store_arg}/locks"))
            .args(["-prune", "-o", "-printf", "%P %s\n"])
            .output()
            .unwrap();
        let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.contains("last-used"))
            .map(str::to_string)
            .collect();
        lines.sort();
        lines
    };
    let before = listing();
    let run = f.srun(&[
        "-w",
        node,
        &format!("--container-image={}", big.via_proxy),
        "true",
    ]);
    f.assert_failed_with(run, &big.via_proxy, &["no space left", "berth gc"]);
    // Verified layers stay for the next try (`berth gc` removes them once
    // unused); the one that did not fit is gone.
    let after: Vec<String> = listing()
        .into_iter()
        .filter(|l| !l.starts_with("blobs/sha256/") || before.contains(l))
        .filter(|l| !l.starts_with("blobs/sha256 ") && !l.starts_with(" "))
        .collect();
    let before: Vec<String> = before
        .into_iter()
        .filter(|l| !l.starts_with("blobs/sha256 ") && !l.starts_with(" "))
        .collect();
    assert_eq!(before, after, "the store changed");
    let big_layer = big.layers[1].trim_start_matches("sha256:");
    assert!(
        !listing().iter().any(|l| l.contains(big_layer)),
        "the layer that did not fit is in the store"
    );
    assert!(
        !listing().iter().any(|l| l.starts_with("tmp/")),
        "space not given back: {:?}",
        listing()
    );
    // The image already there still runs.
    f.srun(&[
        "-w",
        node,
        &format!("--container-image={}", small.via_proxy),
        "true",
    ])
    .ok();
    f.assert_clean("full store");
}

/// scancel while the container is set up (its ENTRYPOINT runs) and while
/// the task runs: nothing left, no node drained, the next step runs. During
/// the pull: [`scancel_stops_a_stalled_pull_within_seconds`].
#[test]
fn scancel_at_each_stage_leaves_nothing_behind() {
    let Some(f) = Faults::get() else { return };
    let node = "node1";
    // During the pull: scancel_stops_a_stalled_pull_within_seconds.
    let image = f.fresh_image("cancel-run");

    // During the setup (the image ENTRYPOINT sleeps 6 s: Slurm lets the
    // setup finish before it ends the step).
    let repository = f.repository("cancel-setup");
    let base = busybox_layer(&f.busybox_tar(), &repository);
    let script = "sleep 6; exec \"$@\"".to_string();
    let slow = f.push_image(
        &repository,
        "t",
        &base,
        &[],
        Some(&["/bin/sh", "-c", &script, "entrypoint"]),
    );
    let name = format!("faults-cancel-setup-{}", std::process::id());
    let srun = f.spawn_srun(&[
        "-w",
        node,
        "-J",
        &name,
        "--container-entrypoint",
        &format!("--container-image={}", slow.via_proxy),
        "true",
    ]);
    let job = job_id(&f, &name);
    assert!(
        wait_for(Duration::from_secs(60), || !f.pids_of("sleep 6").is_empty()),
        "the entrypoint never started"
    );
    f.run_as("root", "scancel", &[&job]).ok();
    finish(srun);
    f.assert_clean("scancel during the setup");

    // During the run.
    let name = format!("faults-cancel-run-{}", std::process::id());
    let srun = f.spawn_srun(&[
        "-w",
        node,
        "-J",
        &name,
        &format!("--container-image={}", image.via_proxy),
        "sleep",
        MARKER_SLEEP,
    ]);
    let job = job_id(&f, &name);
    assert!(
        wait_for(Duration::from_secs(60), || !f
            .pids_of(&format!("sleep {MARKER_SLEEP}"))
            .is_empty()),
        "the task never started"
    );
    f.run_as("root", "scancel", &[&job]).ok();
    finish(srun);
    f.assert_clean("scancel during the run");
    f.srun(&[
        "-w",
        node,
        &format!("--container-image={}", image.via_proxy),
        "true",
    ])
    .ok();
}

/// scancel of a job whose pull is stalled (a registry silent for two
/// minutes): Slurm signals nothing before the tasks exist, so the setup asks
/// slurmctld every `cancel_check` seconds; the pull is stopped and the job
/// gone within seconds, not when the registry times out.
#[test]
fn scancel_stops_a_stalled_pull_within_seconds() {
    let Some(f) = Faults::get() else { return };
    let _slow = PlugstackArgs::add(&f, "registry_timeout=120 registry_retries=0 cancel_check=1");
    let node = "node1";
    let name = format!("faults-cancel-watch-{}", std::process::id());
    let (image, srun) = f.spawn_stalled_pull(node, "cancel-watch", &["-J", &name]);
    let job = job_id(&f, &name);
    if f.var("BERTH_TEST_SITE") == "gpu" {
        // proctrack/cgroup (issue 19 point 6): the helpers of a step being
        // set up are in the job's freezer cgroup (proctrack/cgroup v1 puts
        // the step's tasks, not slurmstepd, in the step's) and in the
        // step's devices cgroup (task/cgroup). So Slurm's own kill of the
        // step does not reach a pull that is still running: berth's cancel
        // watcher (below) is what stops it.
        for pid in f.pids_of("berth __pull") {
            let cgroups =
                std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let path_of = |controller: &str| {
                cgroups
                    .lines()
                    .find_map(|l| l.split_once(&format!(":{controller}:")).map(|(_, p)| p))
                    .unwrap_or_default()
                    .to_string()
            };
            let job_cgroup = format!("/job_{job}");
            assert!(
                path_of("freezer").contains(&job_cgroup)
                    && path_of("devices").contains(&format!("{job_cgroup}/step_")),
                "berth __pull {pid} is outside job {job}'s cgroups:\n{cgroups}"
            );
        }
    }
    let cancelled = Instant::now();
    f.run_as("root", "scancel", &[&job]).ok();
    assert!(
        wait_for(Duration::from_secs(20), || f
            .pids_of("berth __pull")
            .is_empty()),
        "the stalled pull still runs {:?} after scancel",
        cancelled.elapsed()
    );
    assert!(
        wait_for(Duration::from_secs(20), || f
            .run_as("root", "squeue", &["-h", "-j", &job])
            .stdout
            .trim()
            .is_empty()),
        "job {job} still listed {:?} after scancel",
        cancelled.elapsed()
    );
    let stopped_in = cancelled.elapsed();
    finish(srun);
    let log_path = Path::new(&f.var("BERTH_TEST_LOG_DIR")).join(format!("slurmd-{node}.log"));
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        log.contains(&format!("container setup stopped: job {job} ended")),
        "{} does not say why the setup stopped",
        log_path.display()
    );
    f.assert_clean("scancel during a stalled pull");
    assert!(!f.images(node).contains(&image.repository));
    f.assert_next_pull_runs_and_sweeps(node, &image);
    eprintln!("the stalled pull ended {stopped_in:?} after scancel");
}

/// Steps ended by a signal (scancel -s TERM, scancel -s KILL, srun's Ctrl-C
/// twice) and by their time limit: nothing left, no node drained.
#[test]
fn signals_and_time_limits_leave_nothing_behind() {
    let Some(f) = Faults::get() else { return };
    let image = f.fresh_image("signals");
    let image_opt = format!("--container-image={}", image.via_proxy);
    // Pull once, so all steps start at once.
    f.srun(&["-N2", &image_opt, "true"]).ok();
    let pid = std::process::id();
    let timed = format!("faults-time-{pid}");
    let limit = f.spawn_srun(&[
        "-J",
        &timed,
        "-t",
        "0:05",
        "--oversubscribe",
        &image_opt,
        "sleep",
        MARKER_SLEEP,
    ]);
    let mut jobs = Vec::new();
    for what in ["term", "kill", "int"] {
        let name = format!("faults-{what}-{pid}");
        let child = f.spawn_srun(&[
            "-J",
            &name,
            "--oversubscribe",
            &image_opt,
            "sleep",
            MARKER_SLEEP,
        ]);
        jobs.push((what, name, child));
    }
    assert!(
        wait_for(Duration::from_secs(60), || f
            .pids_of(&format!("sleep {MARKER_SLEEP}"))
            .len()
            >= 4),
        "the tasks never all started"
    );
    for (what, name, child) in &jobs {
        let job = job_id(&f, name);
        match *what {
            "term" => f
                .run_as("root", "scancel", &["-s", "TERM", &format!("{job}.0")])
                .ok(),
            "kill" => f
                .run_as("root", "scancel", &["-s", "KILL", &format!("{job}.0")])
                .ok(),
            _ => {
                // srun's Ctrl-C: SIGINT twice within a second ends the step.
                let srun_pid = Command::new("pgrep")
                    .args(["-P", &child.id().to_string()])
                    .output()
                    .unwrap();
                let srun_pid: u32 = String::from_utf8_lossy(&srun_pid.stdout)
                    .trim()
                    .parse()
                    .expect("srun under timeout");
                kill(srun_pid, libc::SIGINT);
                std::thread::sleep(Duration::from_millis(200));
                kill(srun_pid, libc::SIGINT);
                Run {
                    code: 0,
                    stdout: String::new(),
                    stderr: String::new(),
                }
            }
        };
    }
    for (what, _, child) in jobs {
        let run = finish(child);
        assert_ne!(run.code, 0, "{what}: {}", run.stderr);
    }
    let run = finish(limit);
    assert_ne!(run.code, 0, "time limit: {}", run.stderr);
    assert!(
        run.stderr.contains("TIME LIMIT") || run.stderr.contains("time limit"),
        "{}",
        run.stderr
    );
    f.assert_clean("signals and time limit");
}

/// 16 steps of five users at once on one node, three images sharing layers,
/// none in the store at the start: all run, and each blob is fetched from
/// the registry once.
#[test]
fn sixteen_concurrent_steps_fetch_each_blob_once() {
    let Some(f) = Faults::get() else { return };
    let node = "node1";
    let repository = f.repository("concurrent");
    let base = busybox_layer(&f.busybox_tar(), &repository);
    let shared = file_layer("shared", &noise(2 << 20, 1));
    let a = f.push_image(&repository, "a", &base, std::slice::from_ref(&shared), None);
    let b = f.push_image(
        &repository,
        "b",
        &base,
        &[file_layer("b", &noise(1 << 20, 2))],
        None,
    );
    let c = f.push_image(
        &repository,
        "c",
        &base,
        &[shared, file_layer("c", &noise(1 << 20, 3))],
        None,
    );
    let registry = f.cluster.registry();
    let images = [
        format!("{registry}/{repository}:a"),
        format!("{registry}/{repository}:b"),
        format!("{registry}/{repository}:c"),
    ];
    let mut users = vec!["root".to_string(), common::TEST_USER.to_string()];
    users.extend(
        f.var("BERTH_TEST_OTHER_USERS")
            .split_whitespace()
            .map(str::to_string),
    );
    let started = Instant::now();
    let children: Vec<(String, String, Child)> = (0..16)
        .map(|i| {
            let user = users[i % users.len()].clone();
            let image = images[i % images.len()].clone();
            let child = f
                .command_as(
                    &user,
                    "srun",
                    &[
                        "-w",
                        node,
                        "--oversubscribe",
                        &format!("--container-image={image}"),
                        "sh",
                        "-c",
                        "test -e /etc/berth-fault && id -un",
                    ],
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (user, image, child)
        })
        .collect();
    for (user, image, child) in children {
        let run = finish(child);
        assert_eq!(run.code, 0, "{user} {image}: {}", run.stderr);
        assert_eq!(run.stdout.trim(), user, "{user} {image}");
    }
    eprintln!("16 steps in {:.1} s", started.elapsed().as_secs_f64());
    let log = std::fs::read_to_string(f.var("BERTH_TEST_REGISTRY_LOG")).unwrap();
    let mut blobs: Vec<&String> = a
        .layers
        .iter()
        .chain(&b.layers)
        .chain(&c.layers)
        .chain([&a.config, &b.config, &c.config])
        .collect();
    blobs.sort();
    blobs.dedup();
    assert_eq!(blobs.len(), 4 + 3, "base, shared, b, c and three configs");
    for blob in blobs {
        let needle = format!("\"GET /v2/{repository}/blobs/{blob} HTTP/1.1\" 200 ");
        let fetched = log.lines().filter(|l| l.contains(&needle)).count();
        assert_eq!(fetched, 1, "blob {blob} fetched {fetched} times");
    }
    f.assert_clean("16 concurrent steps");
}

/// Pulls `image` on node1 as root and as the user and checks that the
/// node's blob request went through `proxy`.
fn assert_pulls_go_through(f: &Faults, proxy: &ForwardProxy, image: &Pushed) {
    for user in ["root", common::TEST_USER] {
        let option = format!("--container-image={}", image.via_proxy);
        f.run_as(user, "srun", &["-N1", "-w", "node1", &option, "true"])
            .ok();
    }
    let seen = proxy.seen_from_nodes(&f.var("BERTH_TEST_BRIDGE_IP"), &image.repository);
    assert!(
        seen.iter()
            .any(|l| l.contains(&format!("/blobs/{}", image.layers[0]))),
        "the node's blob request did not go through the proxy: {seen:?}\nall: {:?}",
        proxy.requests()
    );
}

/// Pulls `image` on node2 and checks that none of its requests went
/// through `proxy` (`no_proxy` names `host`).
fn assert_pull_goes_direct(f: &Faults, proxy: &ForwardProxy, image: &Pushed, host: &str) {
    let option = format!("--container-image={}", image.via_proxy);
    f.srun(&["-N1", "-w", "node2", &option, "true"]).ok();
    assert!(
        proxy
            .seen_from_nodes(&f.var("BERTH_TEST_BRIDGE_IP"), &image.repository)
            .is_empty(),
        "no_proxy={host} still went through the proxy: {:?}",
        proxy.requests()
    );
}

/// Nodes behind a proxy: `http_proxy=` on the plugstack line sends the
/// nodes' registry requests through it (the pull helper's environment is
/// cleared, so the job's or root's variables could not), and `no_proxy=`
/// naming the registry sends them directly again.
#[test]
fn node_pulls_go_through_the_configured_proxy() {
    let Some(f) = Faults::get() else { return };
    let bridge = f.var("BERTH_TEST_BRIDGE_IP");
    let proxy = ForwardProxy::start(&bridge);
    let through = f.fresh_image("proxied");
    let direct = f.fresh_image("unproxied");
    {
        let _args = PlugstackArgs::add(&f, &format!("http_proxy=http://{}", proxy.addr));
        assert_pulls_go_through(&f, &proxy, &through);
    }
    let host = f.proxy();
    let host = host.split(':').next().unwrap();
    let _args = PlugstackArgs::add(
        &f,
        &format!("http_proxy=http://{} no_proxy={host}", proxy.addr),
    );
    assert_pull_goes_direct(&f, &proxy, &direct, host);
    f.assert_clean("pulls through a proxy");
}

/// A pyxis + enroot site whose nodes reach registries through a proxy set
/// in enroot.conf (`http_proxy` without a scheme, as curl takes it): berth's
/// node pulls go through it with that file as it is, and its `no_proxy`
/// naming the registry sends them directly again.
#[test]
fn a_proxy_in_enroots_configuration_serves_node_pulls() {
    let Some(f) = Faults::get() else { return };
    let bridge = f.var("BERTH_TEST_BRIDGE_IP");
    let proxy = ForwardProxy::start(&bridge);
    let site = f.fresh_state_folder("enroot-proxy");
    let conf = site.join("enroot.conf");
    let _line = PlugstackArgs::add(&f, &format!("enroot_config_path={}", site.display()));
    let through = f.fresh_image("enroot-proxied");
    common::replace_atomically(
        &conf,
        &format!(
            "ENROOT_REMAP_ROOT no\n#https_proxy\nhttp_proxy {}\n",
            proxy.addr
        ),
    );
    assert_pulls_go_through(&f, &proxy, &through);
    let direct = f.fresh_image("enroot-unproxied");
    let host = f.proxy();
    let host = host.split(':').next().unwrap();
    common::replace_atomically(
        &conf,
        &format!("http_proxy {}\nno_proxy {host}\n", proxy.addr),
    );
    assert_pull_goes_direct(&f, &proxy, &direct, host);
    f.assert_clean("pulls through enroot.conf's proxy");
    let _ = std::fs::remove_dir_all(&site);
}

/// `log_level=debug` on the plugstack line: slurmd's log shows the
/// container's mount table, one fstab-like line per mount (the system binds
/// and the user's mounts among them); at the default level it shows none.
#[test]
fn debug_log_shows_the_mount_table() {
    let Some(f) = Faults::get() else { return };
    let node = "node1";
    let image = format!("--container-image={}", f.cluster.image("busybox:latest"));
    let log_path = Path::new(&f.var("BERTH_TEST_LOG_DIR")).join(format!("slurmd-{node}.log"));
    let start = || {
        let run = f
            .srun(&[
                "-w",
                node,
                &image,
                "--container-mounts=/tmp:/data:ro",
                "sh",
                "-c",
                "echo $SLURM_JOB_ID",
            ])
            .ok();
        run.stdout.trim().to_string()
    };
    let table_of = |job: &str| -> Vec<String> {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        log.lines()
            .filter(|l| l.contains(&format!("job {job} step ")) && l.contains(": mount "))
            .map(|l| l.split(": mount ").nth(1).unwrap_or_default().to_string())
            .collect()
    };
    let quiet = start();
    assert!(
        table_of(&quiet).is_empty(),
        "job {quiet}: a mount table at the default log level: {:?}",
        table_of(&quiet)
    );
    let job = {
        let _debug = PlugstackArgs::add(&f, "log_level=debug");
        start()
    };
    let table = table_of(&job);
    assert!(
        table.iter().any(|l| l.ends_with("# system")),
        "job {job}: no system bind in {}: {table:#?}",
        log_path.display()
    );
    assert!(
        table
            .iter()
            .any(|l| l.starts_with("/tmp /data bind ro") && l.ends_with("# user")),
        "job {job}: the user's mount is not in the table: {table:#?}"
    );
    f.assert_clean("the debug mount table");
}
