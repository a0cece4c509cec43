//! berth's integration tests, one binary (one link of the crate instead of
//! one per file): each module is one former test file with one subject,
//! and tests/run.sh runs the modules one after another (`MODULE::` as the
//! filter), so the tests of one module never run beside another's, as when
//! each file was a binary of its own. The modules that drive the real test
//! cluster (tests/harness) read its environment through [`common`]; without
//! one they pass vacuously (tests/run.sh sets `BERTH_REQUIRE_CLUSTER=1`).
//!
//! One module by hand: `cargo test --release --test suite -- cluster_named::`
//! (or `tests/dev.sh N test --test suite -- cluster_named::`).

mod common;

mod berth_cli;
mod cluster;
mod cluster_apt;
mod cluster_archive;
mod cluster_carried;
mod cluster_enroot_hooks;
mod cluster_enroot_site;
mod cluster_entry;
mod cluster_fanout;
mod cluster_faults;
mod cluster_gpu;
mod cluster_ipc;
mod cluster_join;
mod cluster_leftovers;
mod cluster_mpi;
mod cluster_named;
mod cluster_origin;
mod cluster_pin;
mod cluster_private;
mod cluster_pull;
mod cluster_relative_mounts;
mod cluster_shapes;
mod cluster_shared;
mod cluster_site;
mod cluster_userfile;
mod container_join;
mod container_runtime;
mod doctor;
mod fuzz_smoke;
mod gpu_inject;
mod package;
mod security;
mod security_ldconfig;
mod security_mounts;
mod security_store;
mod store_cli;
mod umoci_equivalence;
