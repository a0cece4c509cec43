//! The SPANK plugin: a thin translation of Slurm's callbacks into calls on the core.
//!
//! - `plugin`: the exported symbols and callbacks Slurm calls, dispatching by context;
//! - `handle`: safe wrappers over the SPANK handle and Slurm's logger;
//! - `options`: the `--container-*` option table and the values a job gave;
//! - `local`: srun/sbatch/salloc side (check options before anything is allocated);
//! - `resolve`: srun/sbatch/salloc side: tag -> digest once, exported to every step;
//! - `timings`: slurmstepd side: per-node setup timings shown with `srun -v`;
//! - `remote`: slurmstepd side (pull, create the container, join tasks to it);
//! - `named_step`: slurmstepd side of `--container-name` (join, reuse or create);
//! - `fanout`: slurmstepd side of `fanout=sbcast` (send, receive, or fall back to a pull);
//! - `cancel_watch`: slurmstepd side: stops a setup whose job ended (scancel, time limit);
//! - `pmi_dirs`: slurmstepd side: the PMI folders bound into the container;
//! - `task_prolog`: slurmstepd side: the site's TaskProlog, run on the host for container tasks.
//!
//! This module must not contain container or registry logic of its own.

mod cancel_watch;
mod fanout;
pub mod ffi;
pub mod handle;
pub mod hetjob;
pub mod local;
mod named_step;
pub mod options;
pub mod plugin;
mod pmi_dirs;

pub mod remote;
pub mod resolve;
pub mod task_prolog;
pub mod timings;
