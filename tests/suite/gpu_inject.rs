//! GPU and CDI injection through `berth run`, on a fake NVIDIA node: device
//! nodes made with mknod (NVIDIA's major 195) under a fake device root, and a
//! fake driver root with real ELF libraries (`libcuda.so.1` exporting
//! `cuDriverGetVersion`) and an `nvidia-smi` script. A program linked against
//! libcuda runs in the plain Debian image, so the loader must find the
//! injected driver.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

use common::{output_of, Cluster, Run};

/// A fake GPU node under a temporary folder.
struct FakeNode {
    base: tempfile::TempDir,
}

impl FakeNode {
    fn new() -> FakeNode {
        let base = tempfile::Builder::new()
            .prefix("berth-gpu-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let node = FakeNode { base };
        let dev = node.path("dev");
        std::fs::create_dir_all(&dev).unwrap();
        for (name, major, minor) in [
            ("nvidia0", 195, 0),
            ("nvidia1", 195, 1),
            ("nvidia2", 195, 2),
            ("nvidiactl", 195, 255),
            ("nvidia-uvm", 510, 0),
        ] {
            let path = dev.join(name);
            sh(&format!(
                "mknod -m 666 {} c {major} {minor}",
                path.display()
            ));
        }
        let lib = node.path("driver/usr/lib64");
        let bin = node.path("driver/usr/bin");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::create_dir_all(&bin).unwrap();
        let src = node.path("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(
            src.join("cuda.c"),
            "int cuDriverGetVersion(int *v) { *v = 12040; return 0; }\n",
        )
        .unwrap();
        std::fs::write(src.join("nvml.c"), "int nvmlInit_v2(void) { return 0; }\n").unwrap();
        std::fs::write(
            src.join("probe.c"),
            "#include <stdio.h>\nint cuDriverGetVersion(int *);\n\
             int main(void) { int v = 0; cuDriverGetVersion(&v); printf(\"driver %d\\n\", v); return 0; }\n",
        )
        .unwrap();
        let (l, s) = (lib.display(), src.display());
        sh(&format!(
            "cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o {l}/libcuda.so.550.54.14 {s}/cuda.c && \
             ln -s libcuda.so.550.54.14 {l}/libcuda.so.1 && \
             cc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o {l}/libnvidia-ml.so.550.54.14 {s}/nvml.c && \
             ln -s libnvidia-ml.so.550.54.14 {l}/libnvidia-ml.so.1 && \
             cc -o {s}/probe {s}/probe.c {l}/libcuda.so.550.54.14"
        ));
        std::fs::write(
            bin.join("nvidia-smi"),
            "#!/bin/sh\necho fake-nvidia-smi; ls /dev | grep nvidia\n",
        )
        .unwrap();
        std::fs::set_permissions(
            bin.join("nvidia-smi"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        let cdi = node.path("cdi");
        std::fs::create_dir_all(&cdi).unwrap();
        std::fs::write(node.path("fpga.conf"), "fpga config\n").unwrap();
        std::fs::write(
            cdi.join("fpga.yaml"),
            format!(
                "---\ncdiVersion: 0.6.0\nkind: vendor.example/fpga\ncontainerEdits:\n  env:\n  - FPGA_VENDOR=example\n\
                 devices:\n- name: a\n  containerEdits:\n    deviceNodes:\n    - path: /dev/fpga0\n      hostPath: {}\n\
                 \x20   mounts:\n    - hostPath: {}\n      containerPath: /etc/fpga.conf\n      options: [ro]\n",
                dev.join("nvidia1").display(),
                node.path("fpga.conf").display()
            )
            .replace("options: [ro]", "options:\n      - ro"),
        )
        .unwrap();
        std::fs::write(
            node.path("berth.conf"),
            format!(
                "gpu_dev_root={}\ngpu_driver_root={}\ncdi_spec_dirs={}\ninject_dir={}\n",
                dev.display(),
                node.path("driver").display(),
                cdi.display(),
                node.path("inject.d").display()
            ),
        )
        .unwrap();
        node
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.base.path().join(rel)
    }

    /// `berth run` as root with this node's config.
    fn run(&self, cluster: &Cluster, args: &[&str], script: &str) -> Run {
        let registry = cluster.registry();
        let image = format!("{registry}/debian:bookworm");
        let store = self.path("store");
        let mut command = Command::new(env!("CARGO_BIN_EXE_berth"));
        command
            .env("BERTH_CONFIG", self.path("berth.conf"))
            .args(["run", "--store", store.to_str().unwrap()])
            .args(["--insecure-registry", &registry])
            .args([
                "--mount",
                &format!("{}:/probe:ro", self.path("src").display()),
            ])
            .args(args)
            .args([image.as_str(), "--", "sh", "-c", script]);
        let out = output_of(&mut command);
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

fn sh(script: &str) {
    let status = Command::new("sh").args(["-c", script]).status().unwrap();
    assert!(status.success(), "{script}");
}

#[test]
fn only_the_given_gpus_and_the_driver_enter_a_plain_image() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let node = FakeNode::new();
    let run = node
        .run(
            &cluster,
            &["--gpus=0,2"],
            "ls /dev | grep nvidia | tr '\\n' ' '; echo; stat -c '%F %t:%T' /dev/nvidia2; \
             ldconfig -p | grep -m1 'libcuda.so.1 '; /probe/probe; nvidia-smi | head -1; \
             test -e /dev/null && echo dev-null-ok",
        )
        .ok();
    let out = &run.stdout;
    assert!(
        out.contains("nvidia-uvm nvidia0 nvidia2 nvidiactl"),
        "{out}\n{}",
        run.stderr
    );
    assert!(!out.contains("nvidia1"), "{out}");
    assert!(out.contains("character special file c3:2"), "{out}");
    assert!(
        out.contains("=> /usr/local/lib/berth/libcuda.so.1"),
        "{out}"
    );
    assert!(out.contains("driver 12040"), "{out}");
    assert!(out.contains("fake-nvidia-smi"), "{out}");
    assert!(out.contains("dev-null-ok"), "{out}");

    let all = node
        .run(
            &cluster,
            &["--gpus=all"],
            "ls /dev | grep -c '^nvidia[0-9]'",
        )
        .ok();
    assert_eq!(all.stdout.trim(), "3", "{}", all.stdout);
    let none = node
        .run(
            &cluster,
            &[],
            "ls /dev | grep -c '^nvidia[0-9]'; /probe/probe || echo no-driver",
        )
        .ok();
    assert!(none.stdout.contains("no-driver"), "{}", none.stdout);

    node.run(&cluster, &["--gpus=4"], "true")
        .failed_with("this node has 3 GPU(s)", "");
    std::fs::remove_file(node.path("driver/usr/lib64/libcuda.so.1")).unwrap();
    node.run(&cluster, &["--gpus=1"], "true")
        .failed_with("libcuda.so.1 is neither", "");
}

#[test]
fn cdi_devices_apply_their_edits() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let node = FakeNode::new();
    let run = node
        .run(
            &cluster,
            &["--device", "vendor.example/fpga=a"],
            "stat -c '%F %t:%T' /dev/fpga0; echo vendor=$FPGA_VENDOR; cat /etc/fpga.conf; \
             echo x >/etc/fpga.conf 2>/dev/null || echo conf-ro",
        )
        .ok();
    let out = &run.stdout;
    assert!(
        out.contains("character special file c3:1"),
        "{out}\n{}",
        run.stderr
    );
    assert!(out.contains("vendor=example"), "{out}");
    assert!(out.contains("fpga config"), "{out}");
    assert!(out.contains("conf-ro"), "{out}");
    let bad = node
        .run(&cluster, &["--device", "vendor.example/fpga=b"], "true")
        .failed();
    assert!(
        bad.stderr.contains("no CDI device 'vendor.example/fpga=b'")
            && bad.stderr.contains("known: vendor.example/fpga=a"),
        "{}",
        bad.stderr
    );
}
