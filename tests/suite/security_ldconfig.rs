//! `ldconfig` over a hostile image tree (issue 18, hole 15), through srun on
//! the real cluster, as root and as the ordinary user.
//!
//! Library injection rebuilds the container's loader cache with the host's
//! `ldconfig -r ROOT`, which reads what the image says: `ld.so.conf`, its
//! `include`s, the libraries' folders. The image here has a loader
//! configuration that names a folder only uid 4242 may read (a root
//! `ldconfig` reads it, the user's cannot), an `include`d file that is a
//! symlink to a host file naming a host library folder, and an
//! `/etc/ld.so.cache` that is a symlink to a host path in a world-writable
//! folder. The cache that comes out must list the injected library, nothing
//! of the folder the user cannot read, and nothing of the host; the host
//! path must stay untouched, and no scratch folder may be left in the root.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{output_of, Cluster, BOTH};

/// Scratch folder of this test process, readable by the test user.
fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(format!("/var/tmp/berth-ldconfig-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        dir
    })
}

fn run(command: &mut Command) {
    let out = output_of(command);
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Host files the image points at: a loader configuration naming a host
/// library folder (with a library in it), and where the image's cache
/// symlink leads.
fn host_side() -> (PathBuf, PathBuf, PathBuf) {
    let libs = scratch().join("host-libs");
    std::fs::create_dir_all(&libs).unwrap();
    std::fs::copy(
        std::fs::canonicalize("/lib/x86_64-linux-gnu/libz.so.1").unwrap(),
        libs.join("libz.so.1"),
    )
    .unwrap();
    let conf = scratch().join("host.conf");
    std::fs::write(&conf, format!("{}\n", libs.display())).unwrap();
    let cache_target = scratch().join("written-by-ldconfig");
    (libs, conf, cache_target)
}

/// Builds and pushes the image once; returns its name.
fn hostile_ldconfig_image(cluster: &Cluster) -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let (_, host_conf, cache_target) = host_side();
        let layer = scratch().join("layer.tar");
        let script = format!(
            r#"
import io, tarfile
def add(t, name, kind=tarfile.REGTYPE, data=b"", mode=0o644, link="", uid=0):
    i = tarfile.TarInfo(name)
    i.type, i.mode, i.linkname, i.uid, i.gid = kind, mode, link, uid, uid
    i.size = len(data) if kind == tarfile.REGTYPE else 0
    t.addfile(i, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
t = tarfile.open("{layer}", "w", format=tarfile.GNU_FORMAT)
add(t, "etc/ld.so.conf", data=b"include /etc/ld.so.conf.d/*.conf\n")
add(t, "etc/ld.so.conf.d/", tarfile.DIRTYPE, mode=0o755)
add(t, "etc/ld.so.conf.d/secret.conf", data=b"/opt/secret\n")
add(t, "etc/ld.so.conf.d/host.conf", tarfile.SYMTYPE, link="{host_conf}")
add(t, "etc/ld.so.cache", tarfile.SYMTYPE, link="{cache_target}")
add(t, "opt/", tarfile.DIRTYPE, mode=0o755)
add(t, "opt/secret/", tarfile.DIRTYPE, mode=0o700, uid=4242)
add(t, "opt/secret/libz.so.1", data=open("/lib/x86_64-linux-gnu/libz.so.1", "rb").read(), uid=4242)
t.close()
"#,
            layer = layer.display(),
            host_conf = host_conf.display(),
            cache_target = cache_target.display(),
        );
        run(Command::new("python3").arg("-c").arg(script));
        let registry = cluster.registry();
        let layout = scratch().join("layout");
        let layout_ref = |tag: &str| format!("oci:{}:{tag}", layout.display());
        run(Command::new("skopeo").args([
            "copy",
            "--quiet",
            "--src-tls-verify=false",
            &format!("docker://{registry}/busybox:latest"),
            &layout_ref("base"),
        ]));
        run(Command::new("umoci").args([
            "raw",
            "add-layer",
            "--image",
            &layout_ref("base")[4..],
            layer.to_str().unwrap(),
            "--tag",
            "ldconfig",
        ]));
        let image = format!("{registry}/security/ldconfig:{}", std::process::id());
        run(Command::new("skopeo").args([
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            &layout_ref("ldconfig"),
            &format!("docker://{image}"),
        ]));
        image
    })
}

/// Writes the injection profile (the host's libz, no MPI ABI check).
fn write_profile(cluster: &Cluster) -> &'static str {
    let dir = PathBuf::from(cluster.var("BERTH_TEST_STATE_DIR")).join("inject.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("test-ldconfig.conf"),
        "# tests/suite/security_ldconfig.rs\nlibrary = libz.so.1\n",
    )
    .unwrap();
    "test-ldconfig"
}

const PROBES: &str = r#"
echo injected=$(grep -c /usr/local/lib/berth/libz.so.1 /etc/ld.so.cache)
echo secret=$(grep -c /opt/secret /etc/ld.so.cache)
echo host=$(grep -c host-libs /etc/ld.so.cache)
echo cache-type=$(stat -c %F /etc/ld.so.cache)
echo scratch=$(ls -a / | grep -c berth-ldconfig)
echo done
"#;

fn probe_value<'a>(stdout: &'a str, key: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= line in\n{stdout}"))
}

#[test]
fn ldconfig_reads_the_image_without_privilege_and_never_the_host() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = hostile_ldconfig_image(&cluster);
    let profile = write_profile(&cluster);
    let (_, _, cache_target) = host_side();
    let image_option = format!("--container-image={image}");
    let mpi_option = format!("--container-mpi={profile}");
    for who in BOTH {
        let out = cluster
            .srun(
                who,
                &["-N1", &image_option, &mpi_option, "sh", "-c", PROBES],
            )
            .ok();
        let stdout = &out.stdout;
        assert!(stdout.contains("done"), "{who:?}: {stdout}\n{}", out.stderr);
        assert_eq!(probe_value(stdout, "injected"), "1", "{who:?}: {stdout}");
        assert_eq!(
            probe_value(stdout, "secret"),
            "0",
            "{who:?}: ldconfig read a folder only uid 4242 may read (it ran with \
             privilege):\n{stdout}"
        );
        assert_eq!(probe_value(stdout, "host"), "0", "{who:?}: {stdout}");
        assert_eq!(
            probe_value(stdout, "cache-type"),
            "regular file",
            "{who:?}: {stdout}"
        );
        assert_eq!(probe_value(stdout, "scratch"), "0", "{who:?}: {stdout}");
        assert!(
            !cache_target.exists(),
            "{who:?}: the image's ld.so.cache symlink was followed to the host"
        );
    }
    cluster.assert_nodes_healthy();
    let _ = std::fs::remove_dir_all(scratch());
}
