//! Generates Rust bindings for the installed `<slurm/spank.h>`, for the
//! `spank` feature (the plugin) only: without it nothing is generated and no
//! Slurm header is needed.
//!
//! The SPANK ABI and the plugin version number come from the Slurm headers on
//! the build machine, never from a copy in this repository, so the plugin
//! always matches the Slurm it was built against.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "spank")]
    spank_bindings();
}

#[cfg(feature = "spank")]
fn spank_bindings() {
    use std::env;
    use std::path::PathBuf;

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
    // The Slurm release the plugin is built for, for `berth doctor`, which
    // must not import the plugin's module to learn it.
    let text = bindings.to_string();
    let version = text
        .split("SLURM_VERSION_NUMBER: u32 = ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .expect("slurm/spank.h defines no SLURM_VERSION_NUMBER");
    println!("cargo:rustc-env=BERTH_BUILT_FOR_SLURM={version}");
}
