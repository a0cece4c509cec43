//! What Slurm tells about one step on one node, copied once into a plain
//! struct (the SPANK items, the job's environment, the batch script), so
//! that the step's logic reads no SPANK handle and runs in tests.

use std::path::PathBuf;

/// Slurm's `SLURM_BATCH_SCRIPT` step id: the batch step of an sbatch job.
pub const BATCH_STEP: u32 = 0xffff_fffb;

/// Slurm's `SLURM_EXTERN_CONT` step id: the extern step (never a container).
pub const EXTERN_STEP: u32 = 0xffff_fffc;

/// One step on one node, as slurmstepd sees it at `user_init`.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The job id.
    pub job: u32,
    /// The step id ([`BATCH_STEP`] for the batch step).
    pub step: u32,
    /// This node's short host name.
    pub node: String,
    /// This node's index in the step (`SLURM_NODEID`), when Slurm gave it.
    pub node_id: Option<u32>,
    /// How many nodes the step runs on.
    pub node_count: u32,
    /// The job's user.
    pub uid: u32,
    /// The job's primary group.
    pub gid: u32,
    /// The job's supplementary groups as Slurm gives them (empty: look
    /// them up on this node).
    pub groups: Vec<u32>,
    /// The job's environment, `NAME=value` each.
    pub job_env: Vec<String>,
    /// The batch step's command line (its script first); `None` for other
    /// steps.
    pub batch_argv: Option<Vec<String>>,
    /// The job's working directory, when known (relative paths of the
    /// options are taken from it).
    pub cwd: Option<PathBuf>,
    /// `srun -v` or more: this node's setup timings are shown to the user.
    pub verbose: bool,
    /// Slurm runs the site's TaskProlog itself, on the host, before the task
    /// enters the container (the plugin enters by exec, Slurm 23.11+): berth
    /// neither runs it nor binds a stand-in for it.
    pub slurm_runs_task_prolog: bool,
}

impl Snapshot {
    /// The value of `name` in the job's environment.
    pub fn job_var(&self, name: &str) -> Option<&str> {
        self.job_env
            .iter()
            .find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
    }
}
