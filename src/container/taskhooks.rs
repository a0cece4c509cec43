//! Per-task environment additions that enroot's hooks and pyxis make, so
//! that job scripts written for them run unchanged:
//!
//! - PMIx ([`pmix_mca_env`]): the image's PMIx client uses the same
//!   security, data-store and transport modules as Slurm's PMIx server;
//! - PyTorch ([`pytorch_env`]): in an image with `PYTORCH_VERSION`,
//!   `torch.distributed` finds its rank, world and rendezvous point from
//!   `srun` alone.
//!
//! Both are pure functions of the task environment as it stands once the
//! image's `Env` is applied (`get` reads it); they return the variables to
//! set, in order.

/// What Slurm's PMIx server exports to each task, and the `PMIX_MCA_*`
/// variable a PMIx client reads to pick the same module.
const PMIX_MODULES: [(&str, &str); 3] = [
    ("PMIX_PTL_MODULE", "PMIX_MCA_ptl"),
    ("PMIX_SECURITY_MODE", "PMIX_MCA_psec"),
    ("PMIX_GDS_MODULE", "PMIX_MCA_gds"),
];

/// `PMIX_MCA_ptl`, `PMIX_MCA_psec` and `PMIX_MCA_gds` from the server's
/// `PMIX_PTL_MODULE`, `PMIX_SECURITY_MODE` and `PMIX_GDS_MODULE`, each only
/// where the task has no such `PMIX_MCA_*` value already, and only for a
/// PMIx step (`SLURM_MPI_TYPE` unset or `pmix*`), as enroot's PMI hook does.
pub fn pmix_mca_env(get: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    let pmix_step =
        get("SLURM_MPI_TYPE").is_none_or(|kind| kind.is_empty() || kind.starts_with("pmix"));
    if !pmix_step {
        return Vec::new();
    }
    PMIX_MODULES
        .iter()
        .filter(|(_, mca)| get(mca).is_none_or(|v| v.is_empty()))
        .filter_map(|(server, mca)| {
            let module = get(server).filter(|v| !v.is_empty())?;
            Some((mca.to_string(), module))
        })
        .collect()
}

/// The variables `torch.distributed` reads, for a task whose environment has
/// `PYTORCH_VERSION` (the NGC PyTorch images set it); empty otherwise.
///
/// `RANK` and `LOCAL_RANK` are always the task's (`SLURM_PROCID`,
/// `SLURM_LOCALID`), as pyxis sets them per task. `WORLD_SIZE`
/// (`SLURM_NTASKS`), `MASTER_ADDR` (the step's first node), `MASTER_PORT`
/// (61000 + job id mod 4536) and, with more tasks than nodes,
/// `OMP_NUM_THREADS=1`, only where the task has no value yet, as enroot's
/// PyTorch hook does.
pub fn pytorch_env(get: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    if get("PYTORCH_VERSION").is_none() {
        return Vec::new();
    }
    let mut env = Vec::new();
    for (from, to) in [("SLURM_PROCID", "RANK"), ("SLURM_LOCALID", "LOCAL_RANK")] {
        if let Some(value) = get(from) {
            env.push((to.to_string(), value));
        }
    }
    let unset = |name: &str| get(name).is_none();
    if unset("WORLD_SIZE") {
        if let Some(tasks) = get("SLURM_NTASKS") {
            env.push(("WORLD_SIZE".to_string(), tasks));
        }
    }
    if unset("MASTER_ADDR") {
        if let Some(first) = get("SLURM_STEP_NODELIST").as_deref().and_then(first_host) {
            env.push(("MASTER_ADDR".to_string(), first));
        }
    }
    if unset("MASTER_PORT") {
        if let Some(job) = get("SLURM_JOB_ID").and_then(|j| j.parse::<u64>().ok()) {
            env.push(("MASTER_PORT".to_string(), (job % 4536 + 61000).to_string()));
        }
    }
    let count = |name: &str| get(name).and_then(|v| v.parse::<u64>().ok()).unwrap_or(1);
    if unset("OMP_NUM_THREADS") && count("SLURM_STEP_NUM_TASKS") > count("SLURM_STEP_NUM_NODES") {
        env.push(("OMP_NUM_THREADS".to_string(), "1".to_string()));
    }
    env
}

/// The first host name of a Slurm host list (`node[1-4,7],gpu01`,
/// `node[001-004]`, `a,b`), as `scontrol show hostnames | head -n1` gives it;
/// `None` for an empty or malformed list.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let Some(open) = list.find('[') else {
        let first = list.split(',').next()?.trim();
        return (!first.is_empty()).then(|| first.to_string());
    };
    let prefix = &list[..open];
    if prefix.contains(',') {
        return first_host(prefix.split(',').next()?);
    }
    let close = open + list[open..].find(']')?;
    let first_range = list[open + 1..close].split(',').next()?;
    let low = first_range.split('-').next()?.trim();
    if low.is_empty() || !low.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // The rest of the name after `]` (up to the next list element), with no
    // further ranges: `rack[1-2]-n` has hosts `rack1-n`, `rack2-n`.
    let rest = list[close + 1..].split(',').next().unwrap_or("");
    if rest.contains('[') {
        return None;
    }
    Some(format!("{prefix}{low}{rest}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    fn names(env: &[(String, String)]) -> Vec<String> {
        env.iter().map(|(n, v)| format!("{n}={v}")).collect()
    }

    #[test]
    fn first_hosts_of_host_lists() {
        assert_eq!(first_host("node[1-4,7]").as_deref(), Some("node1"));
        assert_eq!(first_host("node[001-004]").as_deref(), Some("node001"));
        assert_eq!(first_host("a,b[1-2]").as_deref(), Some("a"));
        assert_eq!(first_host("node3").as_deref(), Some("node3"));
        assert_eq!(first_host("rack[2-3]-n").as_deref(), Some("rack2-n"));
        assert_eq!(first_host(""), None);
        assert_eq!(first_host("node[x]"), None);
        assert_eq!(first_host("node[1"), None);
    }

    #[test]
    fn pmix_modules_follow_the_server_unless_set() {
        let env = [
            ("PMIX_SECURITY_MODE", "native"),
            ("PMIX_GDS_MODULE", "ds21,ds12,hash"),
            ("PMIX_PTL_MODULE", "tcp,usock"),
            ("PMIX_MCA_ptl", "tcp"),
        ];
        assert_eq!(
            names(&pmix_mca_env(env_of(&env))),
            ["PMIX_MCA_psec=native", "PMIX_MCA_gds=ds21,ds12,hash"]
        );
        let pmi2 = [("SLURM_MPI_TYPE", "pmi2"), ("PMIX_GDS_MODULE", "hash")];
        assert!(pmix_mca_env(env_of(&pmi2)).is_empty());
        let pmix = [("SLURM_MPI_TYPE", "pmix_v4"), ("PMIX_GDS_MODULE", "hash")];
        assert_eq!(names(&pmix_mca_env(env_of(&pmix))), ["PMIX_MCA_gds=hash"]);
    }

    #[test]
    fn pytorch_variables_only_with_pytorch_version() {
        let task = [
            ("SLURM_PROCID", "3"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_STEP_NODELIST", "node[1-2]"),
            ("SLURM_JOB_ID", "4600"),
            ("SLURM_STEP_NUM_TASKS", "4"),
            ("SLURM_STEP_NUM_NODES", "2"),
        ];
        assert!(pytorch_env(env_of(&task)).is_empty());
        let mut with = task.to_vec();
        with.push(("PYTORCH_VERSION", "2.3.0"));
        assert_eq!(
            names(&pytorch_env(env_of(&with))),
            [
                "RANK=3",
                "LOCAL_RANK=1",
                "WORLD_SIZE=4",
                "MASTER_ADDR=node1",
                "MASTER_PORT=61064",
                "OMP_NUM_THREADS=1"
            ]
        );
        with.push(("MASTER_PORT", "1234"));
        with.push(("RANK", "99"));
        let env = names(&pytorch_env(env_of(&with)));
        assert!(env.contains(&"RANK=3".to_string()), "{env:?}");
        assert!(!env.iter().any(|e| e.starts_with("MASTER_PORT")), "{env:?}");
    }
}
