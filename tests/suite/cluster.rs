//! Integration tests on the real test cluster: srun and sbatch with
//! `--container-image`, as root and as an ordinary user (see tests/suite/common).

use crate::common;

use common::{Cluster, Submitter, BOTH};

macro_rules! cluster_or_skip {
    () => {
        match Cluster::get() {
            Some(cluster) => cluster,
            None => return,
        }
    };
}

#[test]
fn tasks_see_the_image_and_run_as_the_user() {
    let cluster = cluster_or_skip!();
    let image = cluster.image("busybox:latest");
    for who in BOTH {
        let run = cluster
            .srun(
                who,
                &[
                    "-N1",
                    &format!("--container-image={image}"),
                    "sh",
                    "-c",
                    "cat /etc/os-release; id; whoami; echo env=$BERTH_TEST_ENV; pwd; \
                     test -r /proc/self/status && test -d /sys/kernel && test -d /dev/shm \
                     && test -c /dev/null && test -s /etc/hosts && test -e /etc/resolv.conf \
                     && echo system-mounts-ok",
                ],
            )
            .ok();
        assert!(
            run.stdout.contains("ID=berth-busybox"),
            "{who:?}: {}",
            run.stdout
        );
        assert!(
            run.stdout.contains("env=from-image"),
            "{who:?}: {}",
            run.stdout
        );
        assert!(
            run.stdout.contains("/srv/work"),
            "{who:?}: image WorkingDir: {}",
            run.stdout
        );
        let (uid, name) = match who {
            Submitter::Root => (0, "root"),
            Submitter::User => (user_uid(), common::TEST_USER),
        };
        assert!(
            run.stdout.contains(&format!("uid={uid}({name})")),
            "{who:?}: {}",
            run.stdout
        );
        assert!(
            run.stdout.lines().any(|l| l == name),
            "whoami: {}",
            run.stdout
        );
        if who == Submitter::User {
            assert!(
                run.stdout.contains("berthgrp"),
                "supplementary group: {}",
                run.stdout
            );
        }
    }
}

fn user_uid() -> u32 {
    let out = std::process::Command::new("id")
        .args(["-u", common::TEST_USER])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn user_gid() -> u32 {
    let out = std::process::Command::new("id")
        .args(["-g", common::TEST_USER])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// The uid and gid that the image's root-owned files have inside, as pyxis +
/// enroot give them: the user's own ids (0 with `--container-remap-root`).
fn owner_inside(who: Submitter, remap_root: bool) -> String {
    match (who, remap_root) {
        (Submitter::Root, _) | (Submitter::User, true) => "0:0".to_string(),
        (Submitter::User, false) => format!("{}:{}", user_uid(), user_gid()),
    }
}

#[test]
fn image_files_belong_to_the_user_inside() {
    let cluster = cluster_or_skip!();
    let image = cluster.image("debian:bookworm");
    let script = "id -u; stat -c '%u:%g' / /etc /usr /usr/bin; \
                  touch /newfile && mkdir /mymnt && echo x > /etc/berth-new && \
                  mkdir /usr/berth-dir && touch /usr/berth-dir/f && echo >> /etc/os-release && \
                  stat -c '%u:%g' /newfile /mymnt /etc/berth-new /usr/berth-dir/f /etc/os-release && \
                  rm /newfile /etc/berth-new && rm -r /usr/berth-dir && \
                  rmdir /mymnt && rm /usr/bin/tac && echo changes-ok; \
                  stat -c 'shadow-group:%g' /etc/shadow";
    for who in BOTH {
        for remap_root in [false, true] {
            let mut args = vec![
                "-N1".to_string(),
                format!("--container-image={image}"),
                "--container-writable".to_string(),
            ];
            if remap_root {
                args.push("--container-remap-root".to_string());
            }
            args.extend(["sh", "-c", script].map(String::from));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let run = cluster.srun(who, &args).ok();
            let context = format!("{who:?}, remap_root {remap_root}:\n{}", run.stdout);
            let owner = owner_inside(who, remap_root);
            let lines: Vec<&str> = run.stdout.lines().collect();
            assert_eq!(lines[0], &owner[..owner.find(':').unwrap()], "{context}");
            for line in &lines[1..10] {
                assert_eq!(*line, owner, "{context}");
            }
            assert_eq!(lines[10], "changes-ok", "{context}");
            // Files of other owners in the image (group shadow) stay unmapped:
            // the container's namespace maps only the user's own ids.
            assert_eq!(lines[11], "shadow-group:65534", "{context}");
        }
    }
}

/// Builds `berth-hello_1.0_all.deb` (one file in /usr/share, one in /etc) in
/// a new folder of the work dir, with `dpkg-deb`; returns the folder.
fn build_test_deb(cluster: &Cluster) -> std::path::PathBuf {
    let dir = std::path::Path::new(&cluster.var("BERTH_TEST_WORKDIR"))
        .join(format!("deb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pkg = dir.join("pkg");
    std::fs::create_dir_all(pkg.join("DEBIAN")).unwrap();
    std::fs::create_dir_all(pkg.join("usr/share/berth-hello")).unwrap();
    std::fs::create_dir_all(pkg.join("etc")).unwrap();
    std::fs::write(
        pkg.join("DEBIAN/control"),
        "Package: berth-hello\nVersion: 1.0\nArchitecture: all\n\
         Maintainer: berth tests <tests@example.org>\nDescription: berth test package\n",
    )
    .unwrap();
    std::fs::write(pkg.join("usr/share/berth-hello/hello.txt"), "hello\n").unwrap();
    std::fs::write(pkg.join("etc/berth-hello.conf"), "conf\n").unwrap();
    common::tool(
        "dpkg-deb",
        &[
            "--root-owner-group",
            "--build",
            pkg.to_str().unwrap(),
            dir.join("berth-hello.deb").to_str().unwrap(),
        ],
    );
    common::tool("chmod", &["-R", "a+rX", dir.to_str().unwrap()]);
    dir
}

#[test]
fn apt_installs_a_package_as_remapped_root() {
    let cluster = cluster_or_skip!();
    let image = cluster.image("debian:bookworm");
    let debs = build_test_deb(&cluster);
    let mounts = format!("--container-mounts={}:/debs:ro", debs.display());
    for who in BOTH {
        // apt's download method switches to user _apt; remapped root cannot
        // really switch (setgroups/setgid are no-ops), so apt is told to stay.
        let run = cluster
            .srun(
                who,
                &[
                    "-N1",
                    &format!("--container-image={image}"),
                    "--container-remap-root",
                    &mounts,
                    "sh",
                    "-c",
                    "cd /debs && apt-get install -y -o APT::Sandbox::User=root \
                     ./berth-hello.deb >/dev/null 2>&1; dpkg-query -W -f='${Status}\\n' \
                     berth-hello; stat -c '%u:%g %n' /usr/share/berth-hello/hello.txt \
                     /etc/berth-hello.conf /var/lib/dpkg/status; dpkg -r berth-hello \
                     >/dev/null && test ! -e /etc/berth-hello.conf && echo removed",
                ],
            )
            .ok();
        let context = format!("{who:?}:\n{}\n{}", run.stdout, run.stderr);
        assert!(run.stdout.contains("install ok installed\n"), "{context}");
        for path in [
            "/usr/share/berth-hello/hello.txt",
            "/etc/berth-hello.conf",
            "/var/lib/dpkg/status",
        ] {
            assert!(run.stdout.contains(&format!("0:0 {path}\n")), "{context}");
        }
        assert!(run.stdout.contains("removed"), "{context}");
        // dpkg as the user (no remap-root) refuses, as on any system.
        let run = cluster.srun(
            who,
            &[
                "-N1",
                &format!("--container-image={image}"),
                &mounts,
                "dpkg",
                "-i",
                "/debs/berth-hello.deb",
            ],
        );
        if who == Submitter::User {
            assert_ne!(run.code, 0, "{}", run.stdout);
            assert!(
                run.stderr.contains("requires superuser privilege"),
                "{}",
                run.stderr
            );
        }
    }
    let _ = std::fs::remove_dir_all(&debs);
}

#[test]
fn whiteouts_hide_deleted_file_and_folder() {
    let cluster = cluster_or_skip!();
    let image = cluster.image("debian:bookworm");
    let run = cluster
        .srun(
            Submitter::User,
            &[
                &format!("--container-image={image}"),
                "sh",
                "-c",
                "grep -q bookworm /etc/os-release && echo debian-ok; \
                 test -e /etc/berth-whiteout-file && echo FILE-PRESENT; \
                 test -e /opt/berth-whiteout-dir && echo DIR-PRESENT; \
                 test -e /etc/berth-layer2 && echo layer2-ok; true",
            ],
        )
        .ok();
    assert!(run.stdout.contains("debian-ok"), "{}", run.stdout);
    assert!(run.stdout.contains("layer2-ok"), "{}", run.stdout);
    assert!(
        !run.stdout.contains("FILE-PRESENT"),
        "whiteouted file visible: {}",
        run.stdout
    );
    assert!(
        !run.stdout.contains("DIR-PRESENT"),
        "whiteouted folder visible: {}",
        run.stdout
    );
}

#[test]
fn mounts_and_workdir() {
    let cluster = cluster_or_skip!();
    let image = cluster.image("busybox:latest");
    let work = cluster.var("BERTH_TEST_WORKDIR");
    let shared = format!("{work}/mount-src");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(format!("{shared}/hello.txt"), "hello from the host\n").unwrap();
    let mounts = format!("--container-mounts={shared}:/data,{shared}:/data-ro:ro");
    for who in BOTH {
        let run = cluster
            .srun(
                who,
                &[
                    &format!("--container-image={image}"),
                    &mounts,
                    "--container-workdir=/data",
                    "sh",
                    "-c",
                    "pwd; cat hello.txt; cat /data-ro/hello.txt; \
                     touch /data-ro/x 2>/dev/null && echo RO-WRITABLE || echo ro-refused",
                ],
            )
            .ok();
        assert!(
            run.stdout.starts_with("/data\n"),
            "{who:?} workdir: {}",
            run.stdout
        );
        assert_eq!(
            run.stdout.matches("hello from the host").count(),
            2,
            "{}",
            run.stdout
        );
        assert!(run.stdout.contains("ro-refused"), "{who:?}: {}", run.stdout);
    }
}

#[test]
fn both_nodes_run_tasks() {
    let cluster = cluster_or_skip!();
    let image = cluster.image("busybox:latest");
    let run = cluster
        .srun(
            Submitter::User,
            &[
                "-N2",
                "-n4",
                &format!("--container-image={image}"),
                "sh",
                "-c",
                "echo $(hostname) $(grep ^ID= /etc/os-release)",
            ],
        )
        .ok();
    for node in ["node1", "node2"] {
        assert!(
            run.stdout
                .lines()
                .any(|l| l.starts_with(node) && l.ends_with("ID=berth-busybox")),
            "no containerized task on {node}: {}",
            run.stdout
        );
    }
    assert_eq!(run.stdout.lines().count(), 4, "{}", run.stdout);
}

#[test]
fn pmix_mpi_allreduce_across_nodes() {
    let cluster = cluster_or_skip!();
    let image = cluster.image("openmpi:bookworm");
    for who in BOTH {
        let run = cluster
            .srun(
                who,
                &[
                    "--mpi=pmix",
                    "-N2",
                    "-n4",
                    &format!("--container-image={image}"),
                    "mpi_hello",
                ],
            )
            .ok();
        assert!(
            run.stdout.contains("ok"),
            "{who:?}: {}\n{}",
            run.stdout,
            run.stderr
        );
        for node in ["node1", "node2"] {
            assert!(
                run.stdout.contains(&format!("on {node}")),
                "{who:?}: {}",
                run.stdout
            );
        }
    }
}

#[test]
fn sbatch_steps_run_in_the_container() {
    let cluster = cluster_or_skip!();
    let image = cluster.image("busybox:latest");
    let work = cluster.var("BERTH_TEST_WORKDIR");
    let out = format!("{work}/sbatch-{}.out", std::process::id());
    let _ = std::fs::remove_file(&out);
    let script = format!("srun --container-image={image} cat /etc/os-release");
    cluster
        .slurm(
            Submitter::User,
            "sbatch",
            &[
                "--wait",
                "-N1",
                &format!("--output={out}"),
                "--wrap",
                &script,
            ],
        )
        .ok();
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("ID=berth-busybox"), "{text}");
}

#[test]
fn second_use_downloads_nothing() {
    let cluster = cluster_or_skip!();
    let image = cluster.image("busybox:latest");
    // Make sure both nodes hold the image, then count blob downloads.
    cluster
        .srun(
            Submitter::User,
            &["-N2", &format!("--container-image={image}"), "true"],
        )
        .ok();
    let before = cluster.registry_blob_gets("busybox");
    cluster
        .srun(
            Submitter::Root,
            &["-N2", &format!("--container-image={image}"), "true"],
        )
        .ok();
    let after = cluster.registry_blob_gets("busybox");
    assert_eq!(before, after, "a cached image was downloaded again");
}

#[test]
fn bad_options_fail_before_allocation() {
    let cluster = cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    let cases: &[(&[&str], &str)] = &[
        (&["--container-image=Not A/Valid:Ref"], "--container-image"),
        (&["--container-image=ubuntu:-bad"], "--container-image"),
        (
            &[&image, "--container-mounts=relative/src:/dst"],
            "--container-mounts",
        ),
        (
            &[&image, "--container-workdir=relative"],
            "--container-workdir",
        ),
        (&["--container-workdir=/tmp"], "without --container-image"),
    ];
    for (i, (options, expected)) in cases.iter().enumerate() {
        let name = format!("berth-badopt-{}-{i}", std::process::id());
        let job_name = format!("--job-name={name}");
        let mut args: Vec<&str> = vec![&job_name];
        args.extend_from_slice(options);
        args.push("true");
        cluster
            .srun(Submitter::User, &args)
            .failed_with(expected, &format!("{options:?}"));
        assert!(
            !cluster.job_exists(&name),
            "{options:?}: a job was allocated"
        );
    }
}

#[test]
fn runtime_errors_are_clear_and_leave_nodes_healthy() {
    let cluster = cluster_or_skip!();
    let registry = cluster.registry();
    let work = cluster.var("BERTH_TEST_WORKDIR");
    let cases: Vec<(String, Vec<String>, &str)> = vec![
        (
            "unknown image".into(),
            vec![format!("--container-image={registry}/no-such-image:latest")],
            "not found",
        ),
        (
            "unreachable registry".into(),
            vec!["--container-image=127.0.0.1:9/busybox:latest".into()],
            "reach",
        ),
        (
            "missing mount source".into(),
            vec![
                format!("--container-image={registry}/busybox:latest"),
                format!("--container-mounts={work}/does-not-exist:/data"),
            ],
            "does-not-exist",
        ),
    ];
    for (what, options, expected) in cases {
        let mut args: Vec<&str> = options.iter().map(String::as_str).collect();
        args.push("true");
        cluster
            .srun(Submitter::User, &args)
            .failed_with(expected, &what);
        cluster.assert_nodes_healthy();
    }
}

#[test]
fn srun_help_lists_the_options() {
    let cluster = cluster_or_skip!();
    let run = cluster.srun(Submitter::User, &["--help"]).ok();
    for option in [
        "--container-image",
        "--container-mounts",
        "--container-workdir",
    ] {
        assert!(
            run.stdout.contains(option),
            "srun --help lacks {option}:\n{}",
            run.stdout
        );
    }
}

/// A copy of the plugin claiming another Slurm release must be refused by
/// Slurm's own version check, with its message, and not crash srun.
#[test]
fn plugin_built_for_another_release_is_refused() {
    let cluster = cluster_or_skip!();
    let plugin = format!(
        "{}/prefix/lib/slurm/spank_berth.so",
        cluster.var("BERTH_TEST_STATE_DIR")
    );
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let patched = dir.path().join("spank_berth.so");
    let mut bytes = std::fs::read(&plugin).unwrap();
    let offset = symbol_file_offset(&plugin, &bytes, "plugin_version");
    let current = u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap());
    // Slurm encodes releases as 0xMMmmuu: claim the release two majors back.
    let other = current - 0x020000;
    bytes[offset..offset + 4].copy_from_slice(&other.to_le_bytes());
    std::fs::write(&patched, &bytes).unwrap();

    let run = srun_with_plugstack_line(
        &cluster,
        dir.path(),
        &format!("required {}", patched.display()),
    );
    assert!(
        run.code > 0 && run.code < 128,
        "srun crashed: exit {}\n{}",
        run.code,
        run.stderr
    );
    assert!(
        run.stderr.to_lowercase().contains("version"),
        "expected Slurm's version message:\n{}",
        run.stderr
    );
}

/// An unknown or malformed plugstack argument stops the plugin with a message
/// that names it.
#[test]
fn unknown_plugstack_argument_is_named() {
    let cluster = cluster_or_skip!();
    let plugin = format!(
        "{}/prefix/lib/slurm/spank_berth.so",
        cluster.var("BERTH_TEST_STATE_DIR")
    );
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    for (argument, expected) in [
        ("store_pth=/x", "unknown argument `store_pth`"),
        ("container_scope=node", "container_scope=node"),
        ("use_squashfuse=maybe", "use_squashfuse=maybe: expected 1/0"),
        ("importer=relative/importer", "importer=relative/importer"),
    ] {
        let line = format!("required {plugin} {argument}");

        srun_with_plugstack_line(&cluster, dir.path(), &line).failed_with(expected, argument);
    }
    // A pyxis site's line, every key pyxis 0.24 knows, works unchanged.
    let line = format!(
        "required {plugin} runtime_path=/run/pyxis execute_entrypoint=0 container_scope=global \
         sbatch_support=1 use_enroot_load=0 importer=/usr/share/pyxis/importer use_squashfuse=1"
    );
    let run = srun_with_plugstack_line(&cluster, dir.path(), &line);
    assert_eq!(run.code, 0, "a pyxis plugstack line: {}", run.stderr);
}

/// `srun -N1 true` as the test user, with a copy of the cluster's slurm.conf
/// whose plugstack holds only `line` (files written into `dir`).
fn srun_with_plugstack_line(cluster: &Cluster, dir: &std::path::Path, line: &str) -> common::Run {
    let plugstack = dir.join("plugstack.conf");
    std::fs::write(&plugstack, format!("{line}\n")).unwrap();
    let conf = std::fs::read_to_string(cluster.var("SLURM_CONF")).unwrap();
    let conf: String = conf
        .lines()
        .filter(|l| {
            !l.trim_start()
                .to_ascii_lowercase()
                .starts_with("plugstackconfig")
        })
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        + &format!("PlugStackConfig={}\n", plugstack.display());
    let slurm_conf = dir.join("slurm.conf");
    std::fs::write(&slurm_conf, conf).unwrap();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let mode = if entry.path().is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(
            entry.path(),
            std::os::unix::fs::PermissionsExt::from_mode(mode),
        )
        .unwrap();
    }
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    cluster.slurm_env(
        Submitter::User,
        "srun",
        &["-N1", "true"],
        &[("SLURM_CONF", slurm_conf.to_str().unwrap())],
    )
}

/// File offset of a dynamic symbol's data in an ELF64 shared object.
fn symbol_file_offset(path: &str, elf: &[u8], symbol: &str) -> usize {
    let nm = std::process::Command::new("nm")
        .args(["-D", "--defined-only", path])
        .output()
        .unwrap();
    let address = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .find_map(|l| {
            let mut parts = l.split_whitespace();
            let addr = parts.next()?;
            let _kind = parts.next()?;
            (parts.next()? == symbol).then(|| u64::from_str_radix(addr, 16).unwrap())
        })
        .unwrap_or_else(|| panic!("{symbol} not exported by {path}"));
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let kind = u32::from_le_bytes(elf[ph..ph + 4].try_into().unwrap());
        let (offset, vaddr, filesz) = (u64_at(ph + 8), u64_at(ph + 16), u64_at(ph + 32));
        if kind == 1 && (vaddr..vaddr + filesz).contains(&address) {
            return (offset + address - vaddr) as usize;
        }
    }
    panic!("{symbol} at {address:#x} is in no loadable segment of {path}");
}

/// `PYXIS_CONTAINER_*` and `BERTH_CONTAINER_*` stand in for missing options.
#[test]
fn environment_variables_give_options() {
    let cluster = cluster_or_skip!();
    let image = cluster.image("busybox:latest");
    let run = cluster
        .slurm_env(
            Submitter::User,
            "srun",
            &["sh", "-c", "grep ^ID= /etc/os-release; pwd"],
            &[
                ("PYXIS_CONTAINER_IMAGE", &image),
                ("BERTH_CONTAINER_WORKDIR", "/etc"),
            ],
        )
        .ok();
    assert!(run.stdout.contains("ID=berth-busybox"), "{}", run.stdout);
    assert!(run.stdout.contains("/etc"), "{}", run.stdout);
    let name = format!("berth-badenv-{}", std::process::id());
    cluster
        .slurm_env(
            Submitter::User,
            "srun",
            &[&format!("--job-name={name}"), "true"],
            &[("BERTH_CONTAINER_IMAGE", "Bad Ref")],
        )
        .failed_with("BERTH_CONTAINER_IMAGE=Bad Ref", "");
    assert!(!cluster.job_exists(&name), "a job was allocated");
}

/// pyxis's root file system, home, remap-root, unshare and env options, and
/// the full mount grammar, through srun as root and as the ordinary user.
#[test]
fn pyxis_options_through_srun() {
    let cluster = cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    let work = cluster.var("BERTH_TEST_WORKDIR");
    let src = format!("{work}/opts-src-{}", std::process::id());
    std::fs::create_dir_all(&src).unwrap();
    std::fs::set_permissions(&src, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    std::fs::write(format!("{src}/f"), "x").unwrap();
    let script = format!("{src}/run.sh");
    std::fs::write(&script, "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for who in BOTH {
        // Writable (default) and read-only root file systems; the image's
        // files are the user's (see image_files_belong_to_the_user_inside).
        let probe = "touch /new 2>&1 && echo written; true";
        let run = cluster.srun(who, &[&image, "sh", "-c", probe]).ok();
        assert!(run.stdout.contains("written"), "{who:?}: {}", run.stdout);
        let run = cluster
            .srun(who, &[&image, "--container-readonly", "sh", "-c", probe])
            .ok();
        assert!(
            run.stdout.contains("Read-only file system"),
            "{who:?} readonly: {}",
            run.stdout
        );

        // Remapped root: uid 0 inside, chown succeeds without effect.
        let run = cluster
            .srun(
                who,
                &[&image, "--container-remap-root", "sh", "-c", "id -u; id -un; touch /tmp/berth-remap-$$ && chown 4242:4242 /tmp/berth-remap-$$ && echo chown-ok; rm -f /tmp/berth-remap-$$"],
            )
            .ok();
        assert!(
            run.stdout.starts_with("0\nroot\n"),
            "{who:?} remap-root: {}",
            run.stdout
        );
        assert!(
            run.stdout.contains("chown-ok"),
            "{who:?} remap-root: {}",
            run.stdout
        );

        // Home folder.
        let home = match who {
            Submitter::Root => "/root".to_string(),
            Submitter::User => format!("/home/{}", common::TEST_USER),
        };
        let run = cluster
            .srun(
                who,
                &[
                    &image,
                    "--container-mount-home",
                    "sh",
                    "-c",
                    "test -d \"$HOME\" && echo home=$HOME",
                ],
            )
            .ok();
        assert!(
            run.stdout.contains(&format!("home={home}")),
            "{who:?} mount-home: {}",
            run.stdout
        );

        // A new network namespace has only the loopback interface.
        let run = cluster
            .srun(
                who,
                &[
                    &image,
                    "--container-unshare=net",
                    "sh",
                    "-c",
                    "tail -n +3 /proc/net/dev",
                ],
            )
            .ok();
        let interfaces: Vec<&str> = run
            .stdout
            .lines()
            .filter_map(|l| l.split(':').next())
            .map(str::trim)
            .collect();
        assert_eq!(
            interfaces,
            vec!["lo"],
            "{who:?} unshare=net: {}",
            run.stdout
        );

        // A new UTS namespace: another namespace than the node's, the
        // node's host name kept.
        let uts = "readlink /proc/self/ns/uts; hostname";
        let node = cluster
            .srun(who, &["-w", "node1", &image, "sh", "-c", uts])
            .ok();
        let own = cluster
            .srun(
                who,
                &[
                    "-w",
                    "node1",
                    &image,
                    "--container-unshare=uts",
                    "sh",
                    "-c",
                    uts,
                ],
            )
            .ok();
        let (node_ns, node_name) = node.stdout.split_once('\n').unwrap_or_default();
        let (own_ns, own_name) = own.stdout.split_once('\n').unwrap_or_default();
        assert!(
            node_ns.starts_with("uts:[") && own_ns.starts_with("uts:[") && node_ns != own_ns,
            "{who:?} unshare=uts: {} / {}",
            node.stdout,
            own.stdout
        );
        assert_eq!(node_name.trim(), "node1", "{who:?}: {}", node.stdout);
        assert_eq!(
            own_name.trim(),
            "node1",
            "{who:?} unshare=uts: {}",
            own.stdout
        );

        // Mount grammar: flags joined by +, tmpfs with options, umount.
        let mounts = format!(
            "--container-mounts={src}:/in:ro+noexec,tmpfs:/scratch:size=1M,umount:/etc/resolv.conf"
        );
        let run = cluster
            .srun(
                who,
                &[&image, &mounts, "sh", "-c", "cat /in/f; /in/run.sh 2>&1; grep ' /in ' /proc/self/mountinfo; grep ' /scratch ' /proc/self/mountinfo; grep -c ' /etc/resolv.conf ' /proc/self/mountinfo; true"],
            )
            .ok();
        assert!(
            run.stdout.starts_with('x'),
            "{who:?} mounts: {}",
            run.stdout
        );
        // noexec: the script on the bind does not run.
        assert!(
            !run.stdout.contains("ran") && run.stdout.contains("Permission denied"),
            "{who:?} noexec: {}",
            run.stdout
        );
        let bind = run
            .stdout
            .lines()
            .find(|l| l.contains(" /in "))
            .unwrap_or_default();
        let options = bind.split(' ').nth(5).unwrap_or_default();
        assert!(
            options.split(',').any(|o| o == "ro") && options.split(',').any(|o| o == "noexec"),
            "{who:?} ro+noexec: {bind}"
        );
        assert!(
            run.stdout.contains("size=1024k"),
            "{who:?} tmpfs: {}",
            run.stdout
        );
        assert!(
            run.stdout.trim_end().ends_with('0'),
            "{who:?} umount: {}",
            run.stdout
        );
    }
    // --container-env keeps the job's value over the image's.
    let run = cluster
        .slurm_env(
            Submitter::User,
            "srun",
            &[
                &image,
                "--container-env=BERTH_TEST_ENV",
                "sh",
                "-c",
                "echo $BERTH_TEST_ENV",
            ],
            &[("BERTH_TEST_ENV", "from-job")],
        )
        .ok();
    assert_eq!(run.stdout.trim(), "from-job");
    let run = cluster
        .slurm_env(
            Submitter::User,
            "srun",
            &[&image, "sh", "-c", "echo $BERTH_TEST_ENV"],
            &[("BERTH_TEST_ENV", "from-job")],
        )
        .ok();
    assert_eq!(run.stdout.trim(), "from-image");
}

/// Issue 16's pyxis parity items, through srun: false WRITABLE/READONLY
/// variables, readonly with writable, empty --container-env names, the
/// unbindable mount flag, and the job's locale inside.
#[test]
fn pyxis_parity_of_flags_env_and_mounts() {
    let cluster = cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    let probe = "touch /new 2>&1 && echo written; true";
    // PYXIS_CONTAINER_WRITABLE=0 is read-only, READONLY=0 writable.
    for (variable, value, expected) in [
        ("PYXIS_CONTAINER_WRITABLE", "0", "Read-only file system"),
        ("PYXIS_CONTAINER_READONLY", "0", "written"),
        ("PYXIS_CONTAINER_READONLY", "1", "Read-only file system"),
        ("BERTH_CONTAINER_WRITABLE", "no", "Read-only file system"),
    ] {
        let run = cluster
            .slurm_env(
                Submitter::User,
                "srun",
                &[&image, "sh", "-c", probe],
                &[(variable, value)],
            )
            .ok();
        assert!(
            run.stdout.contains(expected),
            "{variable}={value}: {}",
            run.stdout
        );
    }
    // Refused before any allocation, naming what is wrong.
    let cases: &[(&[&str], &str)] = &[
        (
            &["--container-readonly", "--container-writable"],
            "--container-readonly and --container-writable given together",
        ),
        (
            &["--container-writable", "--container-readonly"],
            "--container-readonly and --container-writable given together",
        ),
        (&["--container-env="], "--container-env=: no variable named"),
        (
            &["--container-env=FOO,"],
            "--container-env=FOO,: an empty variable name",
        ),
    ];
    for (i, (options, expected)) in cases.iter().enumerate() {
        let name = format!("berth-parity-{}-{i}", std::process::id());
        let job_name = format!("--job-name={name}");
        let mut args: Vec<&str> = vec![&job_name, &image];
        args.extend_from_slice(options);
        args.push("true");
        cluster
            .srun(Submitter::User, &args)
            .failed_with(expected, &format!("{options:?}"));
        assert!(
            !cluster.job_exists(&name),
            "{options:?}: a job was allocated"
        );
    }
    // An allocation's --container-readonly, then srun --container-writable in
    // it: no conflict, the srun's own option wins.
    let run = cluster
        .slurm(
            Submitter::User,
            "salloc",
            &[
                "-N1",
                "--container-readonly",
                &image,
                "srun",
                "--container-writable",
                "sh",
                "-c",
                probe,
            ],
        )
        .ok();
    assert!(
        run.stdout.contains("written"),
        "{}\n{}",
        run.stdout,
        run.stderr
    );

    // unbindable: the bind is made, read-only, and unbindable.
    for who in BOTH {
        let run = cluster
            .srun(
                who,
                &[
                    &image,
                    "--container-mounts=/tmp:/mnt:unbindable+ro",
                    "sh",
                    "-c",
                    "grep ' /mnt ' /proc/self/mountinfo; touch /mnt/x 2>&1; true",
                ],
            )
            .ok();
        let line = run
            .stdout
            .lines()
            .find(|l| l.contains(" /mnt "))
            .unwrap_or_else(|| panic!("{who:?}: no /mnt mount:\n{}", run.stdout));
        assert!(line.contains("unbindable"), "{who:?}: {line}");
        assert!(
            line.contains(" ro,") || line.contains(" ro "),
            "{who:?}: {line}"
        );
        assert!(
            run.stdout.contains("Read-only file system"),
            "{who:?}: {}",
            run.stdout
        );
    }

    // The job's LANG, LANGUAGE and LC_ALL stay out unless --container-env
    // names them (as with pyxis): the image's values apply.
    let source = cluster.image("busybox:latest");
    let target = cluster.image(&format!("berth-locale-{}:latest", std::process::id()));
    common::push_with_env(&source, "LANG=C.image", &target, None);
    let locale_image = format!("--container-image={target}");
    let show = "echo LANG=$LANG LANGUAGE=$LANGUAGE LC_ALL=$LC_ALL";
    let run = cluster
        .slurm_env(
            Submitter::User,
            "srun",
            &[&locale_image, "sh", "-c", show],
            &[
                ("LANG", "de_DE.UTF-8"),
                ("LANGUAGE", "de:en"),
                ("LC_ALL", "C.UTF-8"),
            ],
        )
        .ok();
    assert_eq!(run.stdout.trim(), "LANG=C.image LANGUAGE= LC_ALL=");
    let run = cluster
        .slurm_env(
            Submitter::User,
            "srun",
            &[
                &locale_image,
                "--container-env=LANG,LC_ALL",
                "sh",
                "-c",
                show,
            ],
            &[
                ("LANG", "de_DE.UTF-8"),
                ("LANGUAGE", "de:en"),
                ("LC_ALL", "C.UTF-8"),
            ],
        )
        .ok();
    assert_eq!(
        run.stdout.trim(),
        "LANG=de_DE.UTF-8 LANGUAGE= LC_ALL=C.UTF-8"
    );
    let run = cluster
        .command_as(
            common::TEST_USER,
            "srun",
            &[&locale_image, "sh", "-c", show],
        )
        .env_remove("LANG")
        .env_remove("LANGUAGE")
        .env_remove("LC_ALL")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&run.stdout).trim(),
        "LANG=C.image LANGUAGE= LC_ALL=",
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}
