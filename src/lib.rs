//! berth: run Slurm tasks inside OCI images.
//!
//! One core library behind two front ends: the SPANK plugin `spank_berth.so`
//! (loaded by srun, sbatch, salloc and slurmd) and the `berth` command line tool.
//! See docs/ARCHITECTURE.md for the path of a job through these modules.

pub mod config;
pub mod container;
pub mod doctor;
pub mod fanout;
pub mod image;
pub mod inject;
pub mod interrupt;
pub mod named;
pub mod privilege;
pub mod puller;
pub mod reference;
pub mod registry;
pub mod slurm_commands;
pub mod slurm_conf;
pub mod spank;
pub mod stop_signal;
pub mod store;
