//! Generates Rust bindings for the installed `<slurm/spank.h>`.
//!
//! The SPANK ABI and the plugin version number come from the Slurm headers on
//! the build machine, never from a copy in this repository, so the plugin
//! always matches the Slurm it was built against.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=include/spank_wrapper.h");
    println!("cargo:rerun-if-env-changed=SLURM_INCLUDE_DIR");
    let mut builder = bindgen::Builder::default()
        .header("include/spank_wrapper.h")
        .allowlist_function("spank_.*")
        .allowlist_function("slurm_(info|error|verbose|debug|debug2|debug3|spank_log)")
        .allowlist_type("spank_.*")
        .allowlist_var("SLURM_VERSION_.*")
        .allowlist_var("SLURM_(BATCH_SCRIPT|EXTERN_CONT|INTERACTIVE_STEP|PENDING_STEP)")
        .allowlist_var("SPANK_.*")
        .allowlist_var("ESPANK_.*")
        .rustified_enum("spank_context")
        .newtype_enum("spank_item")
        .layout_tests(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    if let Ok(dir) = env::var("SLURM_INCLUDE_DIR") {
        builder = builder.clang_arg(format!("-I{dir}"));
    }
    let bindings = builder.generate().expect(
        "bindgen failed on include/spank_wrapper.h: is libslurm-dev (slurm/spank.h) installed?",
    );
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    bindings
        .write_to_file(out.join("spank_bindings.rs"))
        .expect("cannot write spank bindings");
}
