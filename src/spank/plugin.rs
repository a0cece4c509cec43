//! The symbols Slurm looks up in `spank_berth.so`, and the callbacks, each a
//! short dispatch to `local` or `remote` by context.

use std::ffi::{c_char, c_int, c_uint};
use std::sync::OnceLock;

use super::ffi;
use super::guard::guard;
use super::handle::{self, Context, Spank};
use super::{local, options, remote, resolve};
use crate::config::Config;

/// Plugin name Slurm shows in its messages.
#[no_mangle]
#[used]
pub static plugin_name: [u8; 6] = *b"berth\0";

/// Plugin type: SPANK.
#[no_mangle]
#[used]
pub static plugin_type: [u8; 6] = *b"spank\0";

/// The Slurm release this plugin was built against (from the installed
/// headers); Slurm refuses to load a plugin built for another release.
#[no_mangle]
#[used]
pub static plugin_version: c_uint = ffi::SLURM_VERSION_NUMBER;

/// Version of berth's SPANK interface.
#[no_mangle]
#[used]
pub static spank_plugin_version: c_uint = 1;

/// Slurm 25.05 and later: a failed `slurm_spank_init` fails the job instead
/// of draining the node (Slurm's default, `ESPANK_NODE_FAILURE`). A broken
/// berth setting does not fail `slurm_spank_init` on any release (it fails
/// the steps that want a container, see [`usable_config`]); what still can
/// (registering the options, contain_spank's socket pair) is no node's fault
/// either.
#[cfg(berth_init_failure_mode)]
#[no_mangle]
#[used]
pub static slurm_spank_init_failure_mode: c_int = ffi::slurm_err_t_ESPANK_JOB_FAILURE as c_int;

static CONFIG: OnceLock<Config> = OnceLock::new();

/// Why the configuration could not be used, when `slurm_spank_init` found
/// it broken.
static BROKEN: OnceLock<String> = OnceLock::new();

/// The configuration read at `slurm_spank_init`.
pub fn config() -> &'static Config {
    CONFIG.get_or_init(Config::default)
}

/// The configuration, or why slurmstepd found it broken. A broken one
/// fails only the steps that want a container, with the reason: bare steps
/// run, and no failed `slurm_spank_init` drains the node (as Slurm before
/// 25.05 does for any).
fn usable_config() -> Result<&'static Config, &'static str> {
    match BROKEN.get() {
        Some(why) => Err(why),
        None => Ok(config()),
    }
}

/// Reads the plugstack arguments (and the config file) into [`CONFIG`].
/// When they cannot be used, srun, sbatch and salloc stop with the reason
/// (`Err`: nothing is submitted, no node is involved); slurmd and
/// slurmstepd log it and record it in [`BROKEN`], so that only the steps
/// that want a container fail, and no failed `slurm_spank_init` drains the
/// node.
fn read_config(args: &[String]) -> Result<(), String> {
    match Config::from_plugstack_args(args) {
        Ok(parsed) => {
            handle::set_log_level(parsed.log_level);
            // Once per slurmd start, in slurmd's log.
            if handle::context() == Context::Slurmd {
                for note in &parsed.notes {
                    handle::log_info(note);
                }
            }
            let _ = CONFIG.set(parsed);
        }
        Err(e) if matches!(handle::context(), Context::Local | Context::Allocator) => {
            return Err(e.to_string());
        }
        Err(e) => {
            let why = format!(
                "berth's configuration cannot be used on this host, so no step here runs in \
                 a container: {e}"
            );
            handle::log_error(&why);
            let _ = BROKEN.set(why);
        }
    }
    Ok(())
}

fn plugin_args(argc: c_int, argv: *mut *mut c_char) -> Vec<String> {
    // SAFETY: Slurm passes argc valid C strings in argv.
    unsafe { handle::c_string_array(argc, argv) }
}

/// Called first in every context: reads the configuration, registers options.
#[no_mangle]
pub extern "C" fn slurm_spank_init(sp: ffi::spank_t, argc: c_int, argv: *mut *mut c_char) -> c_int {
    guard("slurm_spank_init", || {
        read_config(&plugin_args(argc, argv))?;
        if handle::context() == Context::Remote {
            remote::record_stepd_process()?;
        }
        let spank = Spank::from_raw(sp);
        match handle::context() {
            Context::Local | Context::Remote => {
                options::register_all(&spank).map_err(|e| e.to_string())
            }
            // pyxis: without sbatch support, sbatch and salloc do not know
            // the options (and say so: "unrecognized option").
            Context::Allocator if config().sbatch_support => {
                options::register_all(&spank).map_err(|e| e.to_string())
            }
            _ => Ok(()),
        }
    })
}

/// Called once options are parsed: srun checks them before any allocation.
#[no_mangle]
pub extern "C" fn slurm_spank_init_post_opt(
    sp: ffi::spank_t,
    _argc: c_int,
    _argv: *mut *mut c_char,
) -> c_int {
    guard("slurm_spank_init_post_opt", || {
        let spank = Spank::from_raw(sp);
        match handle::context() {
            Context::Allocator if !config().sbatch_support => Ok(()),
            Context::Local | Context::Allocator => {
                super::hetjob::check_own_command_line()?;
                options::settle_writable_flags(|name| std::env::var(name).ok(), true)?;
                options::apply_env_defaults(|name| std::env::var(name).ok())?;
                let options = options::current();
                local::check_options(&options)?;
                local::check_slurm_namespaces(&options)?;
                if handle::context() == Context::Allocator {
                    local::refuse_management_in_allocation(&options)?;
                    options::export_for_batch_step();
                }
                resolve::at_submission(&options, config())
            }
            Context::Remote => {
                if spank.step_id().is_ok_and(|s| s == ffi::SLURM_BATCH_SCRIPT) {
                    let copy = spank.getenv(options::BATCH_OPTIONS_VARIABLE);
                    options::apply_batch_options(copy.as_deref())?;
                }
                options::apply_env_defaults(|name| spank.getenv(name))?;
                remote::init_post_opt(&spank)
            }
            _ => Ok(()),
        }
    })
}

/// srun, after the allocation, just before the tasks are launched: with
/// `-v`, say which digest the step runs.
#[no_mangle]
pub extern "C" fn slurm_spank_local_user_init(
    _sp: ffi::spank_t,
    _argc: c_int,
    _argv: *mut *mut c_char,
) -> c_int {
    guard("slurm_spank_local_user_init", || {
        if handle::context() == Context::Local {
            resolve::report();
        }
        Ok(())
    })
}

/// slurmstepd, once per step and node, before tasks start: pull the image and
/// create the container.
#[no_mangle]
pub extern "C" fn slurm_spank_user_init(
    sp: ffi::spank_t,
    _argc: c_int,
    _argv: *mut *mut c_char,
) -> c_int {
    guard("slurm_spank_user_init", || {
        if handle::context() != Context::Remote {
            return Ok(());
        }
        let spank = Spank::from_raw(sp);
        remote::user_init(&spank, usable_config())
    })
}

/// In each task, as the user, just before Slurm execs the command: join the container.
#[no_mangle]
pub extern "C" fn slurm_spank_task_init(
    sp: ffi::spank_t,
    _argc: c_int,
    _argv: *mut *mut c_char,
) -> c_int {
    guard("slurm_spank_task_init", || {
        if handle::context() != Context::Remote {
            return Ok(());
        }
        let spank = Spank::from_raw(sp);
        remote::task_init(&spank, config())
    })
}

/// In slurmstepd after each local task exits: the last one lets go of the
/// container and saves it (`--container-save`).
#[no_mangle]
pub extern "C" fn slurm_spank_task_exit(
    sp: ffi::spank_t,
    _argc: c_int,
    _argv: *mut *mut c_char,
) -> c_int {
    guard("slurm_spank_task_exit", || {
        if handle::context() != Context::Remote {
            return Ok(());
        }
        remote::task_exit(&Spank::from_raw(sp))
    })
}

/// slurmd's epilog on each node of a job (root): removes the job's named
/// containers (scope `job`) and its fan-out files.
#[no_mangle]
pub extern "C" fn slurm_spank_job_epilog(
    sp: ffi::spank_t,
    argc: c_int,
    argv: *mut *mut c_char,
) -> c_int {
    guard("slurm_spank_job_epilog", || {
        // Slurm does not call slurm_spank_init before a job script callback:
        // read the plugstack arguments given here. A broken setting failed
        // the job's steps already (slurm_spank_init in slurmstepd); failing
        // the epilog too would drain the node for the site's configuration.
        let config = match Config::from_plugstack_args(&plugin_args(argc, argv)) {
            Ok(config) => config,
            Err(e) => {
                handle::log_error(&format!(
                    "job epilog: nothing cleaned up, berth's configuration is broken: {e}"
                ));
                return Ok(());
            }
        };
        let job = match std::env::var("SLURM_JOB_ID")
            .ok()
            .and_then(|j| j.parse().ok())
        {
            Some(job) => job,
            None => Spank::from_raw(sp).job_id().map_err(|e| e.to_string())?,
        };
        crate::step::named::job_epilog(job, &config, &remote::SpankReport)
            .map_err(|e| format!("{e:#}"))
    })
}

/// Last call in every context: slurmstepd lets go of the container.
#[no_mangle]
pub extern "C" fn slurm_spank_exit(
    _sp: ffi::spank_t,
    _argc: c_int,
    _argv: *mut *mut c_char,
) -> c_int {
    guard("slurm_spank_exit", || {
        if handle::context() == Context::Remote {
            remote::exit();
        }
        Ok(())
    })
}
