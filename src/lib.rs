//! berth: run Slurm tasks inside OCI images.
//!
//! One core library behind two front ends: the SPANK plugin `spank_berth.so`
//! (loaded by srun, sbatch, salloc and slurmd) and the `berth` command line tool.
//! See docs/ARCHITECTURE.md for the path of a job through these modules.
//!
//! The plugin ([`spank`]) is the default cargo feature `spank`, which needs
//! Slurm's `slurm/spank.h` at build time; `cargo build --no-default-features
//! --bin berth` builds the CLI (and every helper) without it.

pub mod config;
pub mod container;
pub mod doctor;
pub mod enroot_site;
pub mod fanout;
pub mod fdpass;
pub(crate) mod fsutil;
pub mod helper;
pub mod image;
pub mod inject;
pub mod interrupt;
#[cfg(test)]
mod layering;
pub mod named;
pub mod privilege;
pub mod puller;
pub mod reference;
pub mod registry;
pub mod root_files;
pub mod safepath;
pub mod seal;
pub mod slurm_commands;
pub mod slurm_conf;
#[cfg(feature = "spank")]
pub mod spank;
pub mod step;
pub mod stop_signal;
pub mod store;
#[cfg(test)]
mod test_support;
pub mod units;
