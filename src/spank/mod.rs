//! The SPANK plugin: a thin translation of Slurm's callbacks into calls on the core.
//!
//! - `plugin`: the exported symbols and callbacks Slurm calls, dispatching by context;
//! - `guard`: every callback's body under a panic and error guard;
//! - `handle`: safe wrappers over the SPANK handle and Slurm's logger;
//! - `options`: the `--container-*` option table and the values a job gave;
//! - `local`: srun/sbatch/salloc side (check options before anything is allocated);
//! - `resolve`: srun/sbatch/salloc side: tag -> digest once, exported to every step;
//! - `remote`: slurmstepd side: reads the step's snapshot, lets [`crate::step`]
//!   set up the container, joins tasks to it, releases it at the last task's exit;
//! - `contain`: slurmstepd side: the socket pair that carries a `contain_spank` clone's descriptors;
//! - `task_prolog`: slurmstepd side: the site's TaskProlog, run on the host for container tasks;
//! - `hetjob`: srun side: the options of each heterogeneous job component.
//!
//! This module holds no container, image or registry logic of its own: what
//! a step does on a node is [`crate::step`]'s.

mod contain;
pub mod ffi;
mod guard;
pub mod handle;
pub mod hetjob;
pub mod local;
pub mod options;
pub mod plugin;

pub mod remote;
pub mod resolve;
pub mod task_prolog;
