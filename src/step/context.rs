//! What a step works from: the settings, the options, the snapshot's
//! facts and what is made of them once (the user's groups, the save
//! target, the batch script's bind, the TaskProlog), and the step's place
//! in a fan-out.

use std::path::PathBuf;

use super::handover::Handover;
use super::report::Report;
use super::request::StepRequest;
use super::snapshot::Snapshot;
use crate::config::{Config, FanoutMode};
use crate::container::spec::{MountSpec, UserIdentity};
use crate::puller::Requester;

/// What every kind of step needs to build its container.
pub struct StepContext<'a> {
    /// The plugin's settings.
    pub config: &'a Config,
    /// Where the step's messages go.
    pub report: &'a dyn Report,
    /// The job's options, resolved, the image pinned to its digest.
    pub request: StepRequest,
    /// The node store.
    pub store: PathBuf,
    /// Where this node's own state lives (named containers, save scratch):
    /// the store, or its `nodes/NODE` folder when the store is shared.
    pub node_state: PathBuf,
    /// This node's name.
    pub node: String,
    /// How many nodes the step runs on.
    pub node_count: u32,
    /// The job id.
    pub job: u32,
    /// The step id.
    pub step: u32,
    /// The job's user, groups looked up (or as Slurm gave them).
    pub user: UserIdentity,
    /// The job's environment.
    pub job_env: Vec<String>,
    /// The job's working directory, when known.
    pub cwd: Option<PathBuf>,
    /// `--container-save`, resolved and checked.
    pub save_to: Option<PathBuf>,
    /// The batch step's script, bound read-only at its own path.
    pub batch_script: Option<MountSpec>,
    /// This step's place in a fan-out, when the image may come from its first node.
    pub fanout: Option<FanoutStep>,
    /// `srun -v`: show this node's setup timings to the user.
    pub verbose: bool,
    /// The site's TaskProlog (slurm.conf), run on the host before each task
    /// joins.
    pub task_prolog: Option<PathBuf>,
    /// `contain_spank`: where the container's descriptors go before the
    /// step publishes its record; `None` when this process keeps them.
    pub handover: Option<&'a dyn Handover>,
}

impl StepContext<'_> {
    /// The job's user, for whom images are pulled (with their credentials).
    pub fn requester(&self) -> Requester<'_> {
        Requester {
            user: &self.user,
            job_env: &self.job_env,
        }
    }
}

/// A step that fans out, as seen from this node.
#[derive(Debug, Clone)]
pub struct FanoutStep {
    /// This node's index in the step (0 sends).
    pub node_id: u32,
    /// The step's node count.
    pub node_count: u32,
    /// slurmd's `SLURM_CONF`, for `sbcast`.
    pub slurm_conf: Option<PathBuf>,
}

impl FanoutStep {
    /// This node's part in the step's fan-out; `None` when the step does not
    /// fan out (`fanout=none`, fewer nodes than `fanout_min_nodes`).
    pub fn of(snapshot: &Snapshot, config: &Config) -> anyhow::Result<Option<FanoutStep>> {
        // A shared store already gives one pull for the whole cluster.
        if config.fanout.mode == FanoutMode::None || config.store_shared {
            return Ok(None);
        }
        let nodes = snapshot.node_count;
        if !config.fanout.applies_to(nodes) {
            return Ok(None);
        }
        Ok(Some(FanoutStep {
            node_id: snapshot
                .node_id
                .ok_or(
                    "fan-out: Slurm did not say which node of the step this is (SLURM_NODEID); \
                 set fanout=none in plugstack.conf to pull on every node",
                )
                .map_err(anyhow::Error::msg)?,
            node_count: nodes,
            slurm_conf: std::env::var_os("SLURM_CONF").map(PathBuf::from),
        }))
    }
}
