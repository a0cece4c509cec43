//! A store shared by every node (`store_shared=1`) on the real cluster: the
//! test nodes are network namespaces of one host, so one host folder is a
//! file system all of them share (as an NFS or Lustre mount would be).
//!
//! - all nodes start a new image at once: each blob is fetched from the
//!   registry once, for the whole cluster;
//! - a puller killed with SIGKILL while it holds the lease: a node takes
//!   over after `store_lease_timeout` and the job succeeds;
//! - a puller stopped with SIGSTOP: taken over too; resumed, it finishes
//!   without touching the image the other node published.
//!
//! The tests switch the cluster's plugstack drop-in to a shared store (and
//! back): tests/run.sh runs this file alone.

use crate::common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{output_of, Cluster, Submitter};
use sha2::{Digest as _, Sha256};

/// The drop-in switch is global to the cluster: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Seconds without a heartbeat before a puller is taken over, in these tests.
const LEASE_TIMEOUT: u64 = 3;

/// The cluster's plugstack drop-in pointed at a shared store until dropped.
struct SharedStoreConfig {
    dropin: PathBuf,
    original: String,
    store: PathBuf,
}

impl SharedStoreConfig {
    fn switch(cluster: &Cluster, label: &str) -> SharedStoreConfig {
        let dropin = Path::new(&cluster.var("BERTH_TEST_PLUGSTACK_DIR")).join("berth.conf");
        let original = std::fs::read_to_string(&dropin)
            .unwrap_or_else(|e| panic!("{}: {e}", dropin.display()));
        let store = Path::new(&cluster.var("BERTH_TEST_STATE_DIR"))
            .join(format!("shared-store-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&store);
        let line: Vec<String> = original
            .split_whitespace()
            .map(|word| match word.strip_prefix("store_path=") {
                Some(_) => format!(
                    "store_path={} store_shared=1 store_lease_timeout={LEASE_TIMEOUT} \
                     store_wait_timeout=120",
                    store.display()
                ),
                None => word.to_string(),
            })
            .collect();
        assert!(
            line.iter().any(|w| w.contains("store_shared=1")),
            "{original}"
        );
        std::fs::write(&dropin, format!("{}\n", line.join(" "))).unwrap();
        SharedStoreConfig {
            dropin,
            original,
            store,
        }
    }
}

impl Drop for SharedStoreConfig {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.dropin, &self.original);
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

/// A new repository of this test (a copy of the debian test image, several
/// layers): nothing of it is in any store yet.
fn new_image(cluster: &Cluster, label: &str) -> (String, String) {
    let repository = format!("shared-{label}-{}", std::process::id());
    let image = cluster.image(&format!("{repository}:v1"));
    let mut c = Command::new("skopeo");
    c.args([
        "copy",
        "-q",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
    ])
    .arg(format!("docker://{}", cluster.image("debian:bookworm")))
    .arg(format!("docker://{image}"));
    let out = output_of(&mut c);
    assert!(
        out.status.success(),
        "skopeo copy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (repository, image)
}

/// Blob GETs of `repository` in the registry log, per digest.
fn blob_gets(cluster: &Cluster, repository: &str) -> HashMap<String, usize> {
    let log = std::fs::read_to_string(cluster.var("BERTH_TEST_REGISTRY_LOG")).unwrap_or_default();
    let needle = format!("\"GET /v2/{repository}/blobs/");
    let mut gets = HashMap::new();
    for line in log.lines().filter(|l| l.contains(&needle)) {
        let rest = &line[line.find(&needle).unwrap() + needle.len()..];
        let digest = rest
            .split([' ', '?'])
            .next()
            .unwrap_or_default()
            .to_string();
        *gets.entry(digest).or_insert(0) += 1;
    }
    gets
}

/// Nodes of the default partition (where a plain srun lands).
fn node_count(cluster: &Cluster) -> usize {
    cluster
        .var("BERTH_TEST_DEFAULT_NODES")
        .parse()
        .unwrap_or_else(|_| cluster.var("BERTH_TEST_NODE_NAMES").split(',').count())
}

/// Runs the image on every node at once as `who`; each prints the image's
/// Debian version. Returns srun's stderr.
fn run_on_all_nodes(cluster: &Cluster, who: Submitter, image: &str) -> String {
    let n = node_count(cluster).to_string();
    let run = cluster
        .srun(
            who,
            &[
                "-N",
                &n,
                &format!("--container-image={image}"),
                "cat",
                "/etc/debian_version",
            ],
        )
        .ok();
    assert_eq!(
        run.stdout.lines().count(),
        node_count(cluster),
        "{}",
        run.stdout
    );
    run.stderr
}

/// How many nodes said they downloaded and converted the image.
fn pulls(stderr: &str) -> usize {
    stderr.lines().filter(|l| l.contains(": pulled ")).count()
}

/// Entries of a folder (none when it does not exist).
fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// The one published image folder of the store.
fn only_image(store: &Path) -> PathBuf {
    let images = entries(&store.join("images"));
    assert_eq!(images.len(), 1, "{images:?}");
    images[0].clone()
}

/// Asserts the shared folders hold no lease and no node's temp file.
fn assert_clean(store: &Path) {
    let leases = entries(&store.join("leases"));
    assert!(leases.is_empty(), "leases left: {leases:?}");
    for host in entries(&store.join("tmp")) {
        let left = entries(&host);
        assert!(left.is_empty(), "temp files left: {left:?}");
    }
    assert!(entries(&store.join("retired")).is_empty());
}

/// One job of `who` on every node pulls a new image into the shared store
/// once (each blob fetched once), a second job downloads nothing; returns
/// the image's folder.
fn pulls_once_then_reuses(
    cluster: &Cluster,
    who: Submitter,
    config: &SharedStoreConfig,
    label: &str,
) -> PathBuf {
    let (repository, image) = new_image(cluster, label);
    let stderr = run_on_all_nodes(cluster, who, &image);
    assert_eq!(
        pulls(&stderr),
        1,
        "{who:?}: one node pulls, the others wait:\n{stderr}"
    );
    let gets = blob_gets(cluster, &repository);
    assert!(gets.len() >= 2, "config and layers fetched: {gets:?}");
    assert!(
        gets.values().all(|n| *n == 1),
        "{who:?}: each blob once for {} nodes: {gets:?}",
        node_count(cluster)
    );
    let dir = only_image(&config.store);
    assert!(dir.join("image.sqfs").is_file());
    assert!(config.store.join("shared-store").is_file());
    assert_clean(&config.store);
    // A second job downloads nothing.
    run_on_all_nodes(cluster, who, &image);
    assert_eq!(blob_gets(cluster, &repository), gets, "{who:?}");
    dir
}

#[test]
fn every_blob_is_fetched_once_for_all_nodes() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // Root's jobs and the user's reach the shared store the same way (the
    // pull user writes it); each submitter on a store of its own.
    {
        let config = SharedStoreConfig::switch(&cluster, "once-root");
        pulls_once_then_reuses(&cluster, Submitter::Root, &config, "once-root");
    }
    let config = SharedStoreConfig::switch(&cluster, "once");
    let dir = pulls_once_then_reuses(&cluster, Submitter::User, &config, "once");
    // gc of a shared store needs an age, and keeps what was just used.
    let gc = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["gc", "--store"])
        .arg(&config.store)
        .output()
        .unwrap();
    assert!(!gc.status.success());
    assert!(
        String::from_utf8_lossy(&gc.stderr).contains("--min-age"),
        "{}",
        String::from_utf8_lossy(&gc.stderr)
    );
    let gc = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["gc", "--min-age", "1h", "--max-size", "0", "--store"])
        .arg(&config.store)
        .output()
        .unwrap();
    assert!(
        gc.status.success(),
        "{}",
        String::from_utf8_lossy(&gc.stderr)
    );
    assert!(
        dir.join("image.sqfs").is_file(),
        "a recently used image stays"
    );
}

/// An HTTP proxy for the registry that holds blob requests until released:
/// a `berth pull` through it takes the lease, then hangs in its download.
struct StallingProxy {
    port: u16,
    release: Arc<AtomicBool>,
    stalled: Arc<AtomicUsize>,
}

impl StallingProxy {
    fn start(registry: &str) -> StallingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let release = Arc::new(AtomicBool::new(false));
        let stalled = Arc::new(AtomicUsize::new(0));
        let (r, s, registry) = (
            Arc::clone(&release),
            Arc::clone(&stalled),
            registry.to_string(),
        );
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (r, s, registry) = (Arc::clone(&r), Arc::clone(&s), registry.clone());
                std::thread::spawn(move || {
                    let _ = forward_one(client, &registry, &r, &s);
                });
            }
        });
        StallingProxy {
            port,
            release,
            stalled,
        }
    }
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.release.store(true, Ordering::SeqCst);
    }
}

/// Forwards one request (no body: GET or HEAD) to the registry with
/// `Connection: close`, and its answer back; blob requests wait for `release`.
fn forward_one(
    client: TcpStream,
    registry: &str,
    release: &AtomicBool,
    stalled: &AtomicUsize,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if line == "\r\n" {
            break;
        }
        if !line.to_ascii_lowercase().starts_with("connection:") {
            head.push_str(&line);
        }
    }
    if head.contains("/blobs/") && !release.load(Ordering::SeqCst) {
        stalled.fetch_add(1, Ordering::SeqCst);
        while !release.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    head.push_str("Connection: close\r\n\r\n");
    let mut upstream = TcpStream::connect(registry)?;
    upstream.write_all(head.as_bytes())?;
    let mut answer = upstream;
    let mut client = client;
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = answer.read(&mut buf)?;
        if n == 0 {
            break;
        }
        client.write_all(&buf[..n])?;
    }
    client.shutdown(std::net::Shutdown::Both)
}

/// `berth pull` of `image` into the shared store through `proxy`, as a
/// process of this host (not a node): the puller the nodes will wait for.
fn start_puller(cluster: &Cluster, store: &Path, image: &str, proxy: &StallingProxy) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_berth"));
    for var in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"] {
        command.env_remove(var).env_remove(var.to_ascii_lowercase());
    }
    let proxy_url = format!("http://127.0.0.1:{}", proxy.port);
    command
        .env("HTTP_PROXY", &proxy_url)
        .env("http_proxy", &proxy_url)
        .args([
            "pull",
            "--progress",
            "lines",
            "--shared-store",
            "--lease-timeout",
        ])
        .arg(LEASE_TIMEOUT.to_string())
        .arg("--store")
        .arg(store)
        .args(["--insecure-registry", &cluster.registry(), image])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command.spawn().expect("berth pull")
}

/// Waits until the puller holds the lease and hangs in a blob download.
fn wait_until_holding(store: &Path, proxy: &StallingProxy, puller: &mut Child) {
    let holding = common::wait_for(Duration::from_secs(60), || {
        let lease = entries(&store.join("leases")).iter().any(|p| {
            p.extension().is_some_and(|e| e == "lease")
                && !p.file_name().unwrap().to_string_lossy().starts_with('.')
        });
        lease && proxy.stalled.load(Ordering::SeqCst) > 0
    });
    if !holding {
        let _ = puller.kill();
        let _ = puller.wait();
        let mut err = String::new();
        if let Some(mut e) = puller.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        panic!("the puller never held the lease: {err}");
    }
}

fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
}

fn sha256_of(path: &Path) -> String {
    let mut hasher = Sha256::new();
    hasher.update(std::fs::read(path).unwrap());
    format!("{:x}", hasher.finalize())
}

#[test]
fn a_killed_puller_is_taken_over() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let config = SharedStoreConfig::switch(&cluster, "kill");
    let (_, image) = new_image(&cluster, "kill");
    let proxy = StallingProxy::start(&cluster.registry());
    let mut puller = start_puller(&cluster, &config.store, &image, &proxy);
    wait_until_holding(&config.store, &proxy, &mut puller);
    let pid = puller.id();
    signal(&puller, nix::sys::signal::Signal::SIGKILL);
    let _ = puller.wait();
    let started = Instant::now();
    let stderr = run_on_all_nodes(&cluster, Submitter::User, &image);
    assert!(
        started.elapsed() >= Duration::from_secs(LEASE_TIMEOUT),
        "the nodes waited for the dead puller's lease to go stale"
    );
    let takeovers: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("took over the pull of") && l.contains(&format!("(pid {pid})")))
        .collect();
    assert_eq!(takeovers.len(), 1, "one node takes over:\n{stderr}");
    assert_eq!(pulls(&stderr), 1, "{stderr}");
    only_image(&config.store);
    let leases = entries(&config.store.join("leases"));
    assert!(leases.is_empty(), "{leases:?}");
}

#[test]
fn a_stopped_puller_is_taken_over_and_resumes_harmlessly() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let config = SharedStoreConfig::switch(&cluster, "stop");
    let (_, image) = new_image(&cluster, "stop");
    let proxy = StallingProxy::start(&cluster.registry());
    let mut puller = start_puller(&cluster, &config.store, &image, &proxy);
    wait_until_holding(&config.store, &proxy, &mut puller);
    signal(&puller, nix::sys::signal::Signal::SIGSTOP);
    let stderr = run_on_all_nodes(&cluster, Submitter::User, &image);
    assert!(stderr.contains("took over the pull of"), "{stderr}");
    assert_eq!(pulls(&stderr), 1, "{stderr}");
    let dir = only_image(&config.store);
    let sqfs = dir.join("image.sqfs");
    let (hash, inode) = (
        sha256_of(&sqfs),
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&sqfs).unwrap()),
    );
    // Resume it, with its download let through: it finishes, finds the image
    // published, and leaves it as it is.
    proxy.release.store(true, Ordering::SeqCst);
    signal(&puller, nix::sys::signal::Signal::SIGCONT);
    let out = puller.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(only_image(&config.store), dir);
    assert_eq!(sha256_of(&sqfs), hash, "the published image changed");
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&sqfs).unwrap()),
        inode,
        "the published image was replaced"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&sqfs.display().to_string()),
        "the resumed puller hands out the published image: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_clean(&config.store);
    run_on_all_nodes(&cluster, Submitter::User, &image);
}
