//! Safe wrappers over the SPANK handle and Slurm's logging functions.

use std::ffi::{c_char, c_int, CStr, CString};

use std::sync::atomic::{AtomicU8, Ordering};

use super::ffi;
use crate::config::LogLevel;

/// Where the plugin is running, as Slurm reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Context {
    /// srun (before and after allocation).
    Local,
    /// slurmstepd on a compute node: the job step itself.
    Remote,
    /// sbatch or salloc.
    Allocator,
    /// the slurmd daemon.
    Slurmd,
    /// prolog/epilog scripts.
    JobScript,
    /// Slurm could not say.
    Unknown,
}

/// Returns the context the plugin runs in.
pub fn context() -> Context {
    // SAFETY: spank_context takes no arguments and only reads Slurm's global state.
    match unsafe { ffi::spank_context() } {
        ffi::spank_context::S_CTX_LOCAL => Context::Local,
        ffi::spank_context::S_CTX_REMOTE => Context::Remote,
        ffi::spank_context::S_CTX_ALLOCATOR => Context::Allocator,
        ffi::spank_context::S_CTX_SLURMD => Context::Slurmd,
        ffi::spank_context::S_CTX_JOB_SCRIPT => Context::JobScript,
        _ => Context::Unknown,
    }
}

/// A SPANK handle for the duration of one callback.
#[derive(Clone, Copy)]
pub struct Spank(ffi::spank_t);

/// A SPANK call that failed, with Slurm's own description.
#[derive(Debug, Clone)]
pub struct SpankError {
    /// What berth asked for.
    pub what: String,
    /// Slurm's error text.
    pub reason: String,
}

impl std::fmt::Display for SpankError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slurm refused {}: {}", self.what, self.reason)
    }
}

impl std::error::Error for SpankError {}

fn check(rc: ffi::spank_err_t, what: &str) -> Result<(), SpankError> {
    if rc == ffi::ESPANK_SUCCESS {
        return Ok(());
    }
    // SAFETY: spank_strerror returns a pointer to a static string for any code.
    let reason = unsafe { CStr::from_ptr(ffi::spank_strerror(rc)) }
        .to_string_lossy()
        .into_owned();
    Err(SpankError {
        what: what.to_string(),
        reason,
    })
}

impl Spank {
    /// Wraps the handle Slurm passed to the callback currently running; only
    /// the callbacks in `plugin` make one, and none outlives its callback.
    pub(crate) fn from_raw(raw: ffi::spank_t) -> Spank {
        Spank(raw)
    }

    fn get_u32(&self, item: ffi::spank_item_t, what: &str) -> Result<u32, SpankError> {
        let mut value: u32 = 0;
        // SAFETY: the items passed here all take a single `uint32_t *` (or the
        // same-sized uid_t/gid_t) out-parameter, per spank.h.
        let rc = unsafe { ffi::spank_get_item(self.0, item, &mut value as *mut u32) };
        check(rc, what)?;
        Ok(value)
    }

    /// The job's user id.
    pub fn uid(&self) -> Result<u32, SpankError> {
        self.get_u32(ffi::spank_item::S_JOB_UID, "the job's uid")
    }

    /// The job's primary group id.
    pub fn gid(&self) -> Result<u32, SpankError> {
        self.get_u32(ffi::spank_item::S_JOB_GID, "the job's gid")
    }

    /// The job id.
    pub fn job_id(&self) -> Result<u32, SpankError> {
        self.get_u32(ffi::spank_item::S_JOB_ID, "the job id")
    }

    /// The step id (or one of Slurm's special step ids).
    pub fn step_id(&self) -> Result<u32, SpankError> {
        self.get_u32(ffi::spank_item::S_JOB_STEPID, "the step id")
    }

    /// Number of nodes of this step (in slurmstepd).
    pub fn node_count(&self) -> Result<u32, SpankError> {
        self.get_u32(ffi::spank_item::S_JOB_NNODES, "the step's node count")
    }

    /// This node's index among the step's nodes (`SLURM_NODEID`).
    pub fn node_id(&self) -> Result<u32, SpankError> {
        self.get_u32(ffi::spank_item::S_JOB_NODEID, "this node's id in the step")
    }

    /// Number of tasks of this step on this node.
    pub fn local_task_count(&self) -> Result<u32, SpankError> {
        self.get_u32(
            ffi::spank_item::S_JOB_LOCAL_TASK_COUNT,
            "the local task count",
        )
    }

    /// This task's id among the step's tasks on this node (task callbacks only).
    pub fn local_task_id(&self) -> Result<u32, SpankError> {
        // S_TASK_ID takes an `int *`, the same size as the u32 get_u32 passes.
        self.get_u32(ffi::spank_item::S_TASK_ID, "the local task id")
    }

    /// The job's supplementary group ids.
    pub fn supplementary_gids(&self) -> Result<Vec<u32>, SpankError> {
        let mut list: *mut libc::gid_t = std::ptr::null_mut();
        let mut count: c_int = 0;
        // SAFETY: S_JOB_SUPPLEMENTARY_GIDS takes (gid_t **, int *); Slurm keeps
        // ownership of the array, which we copy before returning.
        let rc = unsafe {
            ffi::spank_get_item(
                self.0,
                ffi::spank_item::S_JOB_SUPPLEMENTARY_GIDS,
                &mut list as *mut *mut libc::gid_t,
                &mut count as *mut c_int,
            )
        };
        check(rc, "the job's supplementary groups")?;
        if list.is_null() || count <= 0 {
            return Ok(Vec::new());
        }
        // SAFETY: Slurm returned `count` valid gids at `list`.
        Ok(unsafe { std::slice::from_raw_parts(list, count as usize) }.to_vec())
    }

    /// The job's environment (remote context), as `KEY=VALUE` strings.
    pub fn job_env(&self) -> Result<Vec<String>, SpankError> {
        let mut env: *mut *mut c_char = std::ptr::null_mut();
        // SAFETY: S_JOB_ENV takes (char ***); the array is NULL-terminated and
        // owned by Slurm, copied here before returning.
        let rc = unsafe {
            ffi::spank_get_item(
                self.0,
                ffi::spank_item::S_JOB_ENV,
                &mut env as *mut *mut *mut c_char,
            )
        };
        check(rc, "the job environment")?;
        let mut out = Vec::new();
        if env.is_null() {
            return Ok(out);
        }
        let mut index = 0;
        loop {
            // SAFETY: walking a NULL-terminated array of C strings from Slurm.
            let entry = unsafe { *env.add(index) };
            if entry.is_null() {
                break;
            }
            // SAFETY: each entry is a valid NUL-terminated string.
            out.push(
                unsafe { CStr::from_ptr(entry) }
                    .to_string_lossy()
                    .into_owned(),
            );
            index += 1;
        }
        Ok(out)
    }

    /// The step's command line (remote context): for the batch step, the
    /// path of the batch script and its arguments.
    pub fn job_argv(&self) -> Result<Vec<String>, SpankError> {
        let mut argc: c_int = 0;
        let mut argv: *mut *mut c_char = std::ptr::null_mut();
        // SAFETY: S_JOB_ARGV takes (int *, char ***); the array is owned by
        // Slurm and copied here before returning.
        let rc = unsafe {
            ffi::spank_get_item(
                self.0,
                ffi::spank_item::S_JOB_ARGV,
                &mut argc as *mut c_int,
                &mut argv as *mut *mut *mut c_char,
            )
        };
        check(rc, "the step's command line")?;
        // SAFETY: Slurm returned `argc` C strings at `argv`.
        Ok(unsafe { c_string_array(argc, argv) })
    }

    /// Reads a variable of the job environment (remote) or the process (local).
    pub fn getenv(&self, name: &str) -> Option<String> {
        let name = CString::new(name).ok()?;
        let mut buf = vec![0u8; 64 * 1024];
        // SAFETY: buf is writable for its full length, which we pass.
        let rc = unsafe {
            ffi::spank_getenv(
                self.0,
                name.as_ptr(),
                buf.as_mut_ptr() as *mut c_char,
                buf.len() as c_int,
            )
        };
        if rc != ffi::ESPANK_SUCCESS {
            return None;
        }
        let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        buf.truncate(len);
        Some(String::from_utf8_lossy(&buf).into_owned())
    }

    /// Sets a variable in the job (or task) environment, replacing any value.
    pub fn setenv(&self, name: &str, value: &str) -> Result<(), SpankError> {
        let what = format!("setting {name} in the task environment");
        let bad = |_| SpankError {
            what: what.clone(),
            reason: "name or value contains a NUL byte".into(),
        };
        let c_name = CString::new(name).map_err(bad)?;
        let c_value = CString::new(value).map_err(bad)?;
        // SAFETY: both pointers are valid NUL-terminated strings for the call.
        let rc = unsafe { ffi::spank_setenv(self.0, c_name.as_ptr(), c_value.as_ptr(), 1) };
        check(rc, &what)
    }

    /// Removes a variable from the task environment (absent is fine).
    pub fn unsetenv(&self, name: &str) -> Result<(), SpankError> {
        let what = format!("removing {name} from the task environment");
        let c_name = CString::new(name).map_err(|_| SpankError {
            what: what.clone(),
            reason: "name contains a NUL byte".into(),
        })?;
        // SAFETY: a valid NUL-terminated string for the duration of the call.
        let rc = unsafe { ffi::spank_unsetenv(self.0, c_name.as_ptr()) };
        check(rc, &what)
    }

    /// Puts `words` before the task's command (Slurm 23.11 and later, in
    /// `task_init` only): Slurm then execs `words[0]` with the task's argv
    /// after them.
    #[cfg(berth_prepend_argv)]
    pub fn prepend_task_argv(&self, words: &[String]) -> Result<(), SpankError> {
        let what = "prepending to the task's command".to_string();
        let owned: Vec<CString> = words
            .iter()
            .map(|w| CString::new(w.as_str()))
            .collect::<Result<_, _>>()
            .map_err(|_| SpankError {
                what: what.clone(),
                reason: "a word contains a NUL byte".into(),
            })?;
        let mut argv: Vec<*const c_char> = owned.iter().map(|w| w.as_ptr()).collect();
        argv.push(std::ptr::null());
        let argc = c_int::try_from(owned.len()).map_err(|_| SpankError {
            what: what.clone(),
            reason: "too many words".into(),
        })?;
        // SAFETY: argv holds argc valid NUL-terminated strings and a final
        // null pointer, alive for the call; Slurm copies the strings.
        let rc = unsafe { ffi::spank_prepend_task_argv(self.0, argc, argv.as_mut_ptr()) };
        check(rc, &what)
    }

    /// Registers one option with Slurm.
    pub fn register_option(&self, option: &mut ffi::spank_option) -> Result<(), SpankError> {
        // SAFETY: the option's strings are 'static and Slurm copies the struct.
        let rc = unsafe { ffi::spank_option_register(self.0, option) };
        check(rc, "registering a --container option")
    }
}

fn to_c_message(message: &str) -> CString {
    CString::new(message.replace('\0', "\\0")).expect("NUL bytes were replaced")
}

/// Logs an error through Slurm (shown to the user by srun, and in slurmd's log).
pub fn log_error(message: &str) {
    let message = to_c_message(&format!("berth: {message}"));
    // SAFETY: a "%s" format with one valid C string argument.
    unsafe { ffi::slurm_error(c"%s".as_ptr(), message.as_ptr()) }
}

/// Copies a C array of `argc` strings (null entries skipped).
///
/// # Safety
/// `argv` must point to `argc` entries, each null or a NUL-terminated string.
pub(crate) unsafe fn c_string_array(argc: c_int, argv: *mut *mut c_char) -> Vec<String> {
    if argv.is_null() {
        return Vec::new();
    }
    (0..argc.max(0) as usize)
        .filter_map(|i| {
            // SAFETY: within the `argc` entries the caller vouches for.
            let arg = unsafe { *argv.add(i) };
            // SAFETY: non-null entries are NUL-terminated strings.
            (!arg.is_null()).then(|| {
                unsafe { CStr::from_ptr(arg) }
                    .to_string_lossy()
                    .into_owned()
            })
        })
        .collect()
}

/// Shows a message to the user (srun's or the batch job's standard error) at
/// error level but without the `error:` prefix (Slurm's `slurm_spank_log`).
pub fn log_user(message: &str) {
    let message = to_c_message(&format!("berth: {message}"));
    // SAFETY: a "%s" format with one valid C string argument.
    unsafe { ffi::slurm_spank_log(c"%s".as_ptr(), message.as_ptr()) }
}

/// srun, sbatch, salloc: a message shown with `-v` (Slurm's verbose level of
/// the client process), e.g. `srun: berth: IMAGE resolved to sha256:...`.
pub fn log_client_verbose(message: &str) {
    let message = to_c_message(&format!("berth: {message}"));
    // SAFETY: a "%s" format with one valid C string argument.
    unsafe { ffi::slurm_verbose(c"%s".as_ptr(), message.as_ptr()) }
}

/// The plugin's `log_level`, as a number (see [`LogLevel`]).
static LOG_LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Info as u8);

/// Sets how much the plugin logs from now on (`log_level`).
pub fn set_log_level(level: LogLevel) {
    LOG_LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Whether a message at `level` passes the configured `log_level`.
fn enabled(level: LogLevel, configured: u8) -> bool {
    level as u8 <= configured
}

fn log_at(level: LogLevel, message: &str) {
    if !enabled(level, LOG_LEVEL.load(Ordering::Relaxed)) {
        return;
    }
    let message = to_c_message(&format!("berth: {message}"));
    // Written at Slurm's info level, so that the plugin's own `log_level`
    // decides, whatever SlurmdDebug says (from info up).
    // SAFETY: a "%s" format with one valid C string argument.
    unsafe { ffi::slurm_info(c"%s".as_ptr(), message.as_ptr()) }
}

/// Logs at berth's info level (one line per container).
pub fn log_info(message: &str) {
    log_at(LogLevel::Info, message);
}

/// Logs at berth's verbose level (each stage).
pub fn log_verbose(message: &str) {
    log_at(LogLevel::Verbose, message);
}

/// Logs at berth's debug level (details).
pub fn log_debug(message: &str) {
    log_at(LogLevel::Debug, message);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_level_lets_through_its_level_and_below() {
        let info = LogLevel::Info as u8;
        assert!(enabled(LogLevel::Error, info));
        assert!(enabled(LogLevel::Info, info));
        assert!(!enabled(LogLevel::Verbose, info));
        assert!(!enabled(LogLevel::Debug, info));
        assert!(enabled(LogLevel::Debug, LogLevel::Debug as u8));
        assert!(!enabled(LogLevel::Info, LogLevel::Error as u8));
    }
}
