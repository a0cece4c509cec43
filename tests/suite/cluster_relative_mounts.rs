//! `--container-mounts` sources written relative to the job's working
//! directory (`./data`, `.`), as pyxis takes them (its `mounts.bats` mounts
//! `./tests/mounts.bats` and `./`), on the real test cluster, as root and
//! as the ordinary test user.

use crate::common;

use common::{Cluster, BOTH};

#[test]
fn relative_mount_sources_come_from_the_working_directory() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    // Jobs start in the cluster's work folder (common::Cluster::command_as).
    let work = std::path::PathBuf::from(cluster.var("BERTH_TEST_WORKDIR"));
    let name = format!("berth-relative-{}", std::process::id());
    let data = work.join(&name).join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("file"), "relative-ok\n").unwrap();
    for dir in [work.join(&name), data.clone()] {
        std::process::Command::new("chmod")
            .arg("755")
            .arg(&dir)
            .status()
            .unwrap();
    }
    let mounts = format!("--container-mounts=./{name}/data:/mnt/data:ro,.:/mnt/here");
    let show = format!("cat /mnt/data/file; test -d /mnt/here/{name} && echo here-ok");
    for who in BOTH {
        let run = cluster
            .srun(who, &["-N1", &image, &mounts, "sh", "-c", &show])
            .ok();
        assert!(
            run.stdout.contains("relative-ok"),
            "{who:?}: {}",
            run.stdout
        );
        assert!(run.stdout.contains("here-ok"), "{who:?}: {}", run.stdout);
    }
    // A bare relative name (no leading '.') is still refused, before the job.
    cluster
        .srun(
            BOTH[0],
            &["-N1", &image, "--container-mounts=data:/data", "true"],
        )
        .failed_with("starting with '.'", "");
    std::fs::remove_dir_all(work.join(&name)).unwrap();
}
