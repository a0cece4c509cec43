//! apt inside a container with `--container-remap-root`, on the real test
//! cluster, as root and as the ordinary test user: apt is told to stay root
//! (it cannot switch to `_apt` in a namespace that maps only the user), as
//! enroot's `10-aptfix` hook does for pyxis; pyxis's suite runs
//! `apt-get update && apt-get install` that way (remap_root.bats, name.bats).

use crate::common;

use common::{Cluster, BOTH};

#[test]
fn remapped_root_apt_stays_root_and_plain_steps_keep_the_image_config() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = format!("--container-image={}", cluster.image("debian:bookworm"));
    let show = "apt-config dump | grep '^APT::Sandbox::User '";
    for who in BOTH {
        let run = cluster
            .srun(
                who,
                &["-N1", &image, "--container-remap-root", "sh", "-c", show],
            )
            .ok();
        assert!(
            run.stdout.contains("APT::Sandbox::User \"root\";"),
            "{who:?}: {}\n{}",
            run.stdout,
            run.stderr
        );
        let run = cluster.srun(who, &["-N1", &image, "sh", "-c", show]).ok();
        assert!(
            run.stdout.contains("APT::Sandbox::User \"_apt\";"),
            "{who:?}: {}\n{}",
            run.stdout,
            run.stderr
        );
    }
}
