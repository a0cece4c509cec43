//! The work of enroot's bundled hook `50-sharp.sh`, done by berth when the
//! site's `hooks.d` has it: a step that asks Slurm for SHARP
//! (`srun --network=sharp`, so `SLURM_NETWORK=sharp`) and is given
//! InfiniBand devices (`MELLANOX_VISIBLE_DEVICES` set, not `void` or
//! `none`) gets the settings the SHARP collective library and NCCL's
//! CollNet need, each only where neither the image nor the job sets it.

/// The settings SHARP needs, with their values: eager locking and group
/// resources (the SHARP library's lazy defaults stall NCCL's first
/// collective), NCCL's CollNet on, and the group size threshold at the
/// step's node count (`SLURM_STEP_NUM_NODES`, else Open MPI's
/// `OMPI_MCA_orte_num_nodes`).
fn wanted(lookup: &dyn Fn(&str) -> Option<String>) -> Vec<(&'static str, String)> {
    let mut wanted = vec![
        ("SHARP_COLL_LOCK_ON_COMM_INIT", "1".to_string()),
        (
            "SHARP_COLL_NUM_COLL_GROUP_RESOURCE_ALLOC_THRESHOLD",
            "0".to_string(),
        ),
        ("NCCL_COLLNET_ENABLE", "1".to_string()),
    ];
    if let Some(nodes) =
        lookup("SLURM_STEP_NUM_NODES").or_else(|| lookup("OMPI_MCA_orte_num_nodes"))
    {
        wanted.push(("NCCL_SHARP_GROUP_SIZE_THRESH", nodes));
    }
    wanted
}

/// The variables (`NAME=VALUE`) to add to a step's container, looking up
/// the container's environment (the job's over the image's) with
/// `lookup`; none when the step does not ask for SHARP or has no
/// InfiniBand devices.
pub fn variables(lookup: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let devices = lookup("MELLANOX_VISIBLE_DEVICES");
    let has_devices = devices.is_some_and(|v| v != "void" && v != "none");
    if !has_devices || lookup("SLURM_NETWORK").as_deref() != Some("sharp") {
        return Vec::new();
    }
    wanted(lookup)
        .into_iter()
        .filter(|(name, _)| lookup(name).is_none())
        .map(|(name, value)| format!("{name}={value}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup_in<'a>(env: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            env.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn a_sharp_step_with_devices_gets_the_settings_it_lacks() {
        let env = [
            ("MELLANOX_VISIBLE_DEVICES", "all"),
            ("SLURM_NETWORK", "sharp"),
            ("SLURM_STEP_NUM_NODES", "16"),
            ("NCCL_COLLNET_ENABLE", "0"),
        ];
        assert_eq!(
            variables(&lookup_in(&env)),
            [
                "SHARP_COLL_LOCK_ON_COMM_INIT=1",
                "SHARP_COLL_NUM_COLL_GROUP_RESOURCE_ALLOC_THRESHOLD=0",
                "NCCL_SHARP_GROUP_SIZE_THRESH=16",
            ]
        );
    }

    #[test]
    fn open_mpis_node_count_stands_in_for_slurms() {
        let env = [
            ("MELLANOX_VISIBLE_DEVICES", "0,1"),
            ("SLURM_NETWORK", "sharp"),
            ("OMPI_MCA_orte_num_nodes", "4"),
        ];
        assert!(variables(&lookup_in(&env)).contains(&"NCCL_SHARP_GROUP_SIZE_THRESH=4".into()));
    }

    #[test]
    fn nothing_without_sharp_or_without_devices() {
        for env in [
            vec![("MELLANOX_VISIBLE_DEVICES", "all")],
            vec![("SLURM_NETWORK", "sharp")],
            vec![
                ("MELLANOX_VISIBLE_DEVICES", "void"),
                ("SLURM_NETWORK", "sharp"),
            ],
            vec![
                ("MELLANOX_VISIBLE_DEVICES", "none"),
                ("SLURM_NETWORK", "sharp"),
            ],
            vec![
                ("MELLANOX_VISIBLE_DEVICES", "all"),
                ("SLURM_NETWORK", "none"),
            ],
        ] {
            assert!(variables(&lookup_in(&env)).is_empty(), "{env:?}");
        }
    }
}
