//! Generates Rust bindings for the installed `<slurm/spank.h>`, for the
//! `spank` feature (the plugin) only: without it nothing is generated and no
//! Slurm header is needed.
//!
//! The SPANK ABI and the plugin version number come from the Slurm headers on
//! the build machine, never from a copy in this repository, so the plugin
//! always matches the Slurm it was built against.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Set by spank_bindings from what the installed Slurm headers offer.
    println!("cargo:rustc-check-cfg=cfg(berth_prepend_argv)");
    println!("cargo:rustc-check-cfg=cfg(berth_init_failure_mode)");
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
    // Slurm 23.11+: a plugin may prepend to the task's argv, so tasks enter
    // the container by exec, after Slurm's own task setup (TaskProlog).
    // BERTH_ENTER_IN_TASK_INIT=1 keeps 22.05's way (join in task_init) on a
    // newer release: for measurements and for checking the tests.
    println!("cargo:rerun-if-env-changed=BERTH_ENTER_IN_TASK_INIT");
    let join_in_task_init = env::var("BERTH_ENTER_IN_TASK_INIT").is_ok_and(|v| v == "1");
    if text.contains("pub fn spank_prepend_task_argv") && !join_in_task_init {
        println!("cargo:rustc-cfg=berth_prepend_argv");
    }
    // Slurm 25.05+: slurm_spank_init_failure_mode (ESPANK_JOB_FAILURE).
    if text.contains("ESPANK_JOB_FAILURE") {
        println!("cargo:rustc-cfg=berth_init_failure_mode");
    }
}
