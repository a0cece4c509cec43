//! The `--container-*` options: one table, one callback, the values a job gave.
//!
//! Every option can also come from `BERTH_CONTAINER_<NAME>` or
//! `PYXIS_CONTAINER_<NAME>` (in that order) when the command line does not
//! give it; booleans there are 1/true/yes/y or 0/false/no/n.

use std::ffi::{c_char, c_int, CStr};
use std::sync::Mutex;

use super::ffi;
use super::handle::{Spank, SpankError};
use crate::config::parse_bool;
use crate::container::spec::{parse_mounts, Namespace};
use crate::named::ContainerName;
use crate::reference::ImageSource;
pub use crate::step::options::{env_names, JobOptions};

impl JobOptions {
    /// The options given besides `--container-image` and `--container-name`
    /// (which each say which container to use), as their command-line names.
    pub fn given_without_image(&self) -> Vec<&'static str> {
        TABLE
            .iter()
            .filter(|def| !matches!(def.setting, Setting::Image | Setting::Name))
            .filter(|def| self.is_set(def.setting))
            .map(|def| def.display_name)
            .collect()
    }

    fn is_set(&self, setting: Setting) -> bool {
        match setting {
            Setting::Image => self.image.is_some(),
            Setting::Mounts => self.mounts.is_some(),
            Setting::Workdir => self.workdir.is_some(),
            Setting::Env => self.env.is_some(),
            Setting::Unshare => self.unshare.is_some(),
            Setting::Mpi => self.mpi.is_some(),
            Setting::Writable(value) => self.writable == Some(value),
            Setting::MountHome(value) => self.mount_home == Some(value),
            Setting::RemapRoot(value) => self.remap_root == Some(value),
            Setting::Entrypoint(value) => self.entrypoint == Some(value),
            Setting::EntrypointLog => self.entrypoint_log == Some(true),
            Setting::Name => self.name.is_some(),
            Setting::Save => self.save.is_some(),
            Setting::Remove => self.remove.is_some(),
            Setting::List => self.list == Some(true),
        }
    }

    /// The argument an option with one was given (`None` for flags).
    fn argument(&self, setting: Setting) -> Option<&String> {
        match setting {
            Setting::Image => self.image.as_ref(),
            Setting::Mounts => self.mounts.as_ref(),
            Setting::Workdir => self.workdir.as_ref(),
            Setting::Env => self.env.as_ref(),
            Setting::Unshare => self.unshare.as_ref(),
            Setting::Mpi => self.mpi.as_ref(),
            Setting::Name => self.name.as_ref(),
            Setting::Save => self.save.as_ref(),
            Setting::Remove => self.remove.as_ref(),
            _ => None,
        }
    }

    fn is_unset(&self, setting: Setting) -> bool {
        match setting {
            Setting::Writable(_) => self.writable.is_none(),
            Setting::MountHome(_) => self.mount_home.is_none(),
            Setting::RemapRoot(_) => self.remap_root.is_none(),
            Setting::Entrypoint(_) => self.entrypoint.is_none(),
            other => !self.is_set(other),
        }
    }

    fn set(&mut self, setting: Setting, value: String) {
        match setting {
            Setting::Image => self.image = Some(value),
            Setting::Mounts => self.mounts = Some(value),
            Setting::Workdir => self.workdir = Some(value),
            Setting::Env => self.env = Some(value),
            Setting::Unshare => self.unshare = Some(value),
            Setting::Mpi => self.mpi = Some(value),
            Setting::Writable(v) => self.writable = Some(v),
            Setting::MountHome(v) => self.mount_home = Some(v),
            Setting::RemapRoot(v) => self.remap_root = Some(v),
            Setting::Entrypoint(v) => self.entrypoint = Some(v),
            Setting::EntrypointLog => self.entrypoint_log = Some(true),
            Setting::Name => self.name = Some(value),
            Setting::Save => self.save = Some(value),
            Setting::Remove => self.remove = Some(value),
            Setting::List => self.list = Some(true),
        }
    }
}

/// What an option sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setting {
    Image,
    Mounts,
    Workdir,
    Env,
    Unshare,
    Mpi,
    Writable(bool),
    MountHome(bool),
    RemapRoot(bool),
    Entrypoint(bool),
    EntrypointLog,
    Name,
    Save,
    Remove,
    List,
}

/// One row of the option table; Slurm's `val` for it is its index plus one.
struct OptionDef {
    /// What the option sets.
    setting: Setting,
    name: &'static CStr,
    /// `--container-image`, for messages.
    display_name: &'static str,
    /// `None` for flags.
    arginfo: Option<&'static CStr>,
    usage: &'static CStr,
    /// `IMAGE` for `PYXIS_CONTAINER_IMAGE`; `None` when another option's
    /// variable covers it (`--no-container-mount-home` is `MOUNT_HOME=0`).
    env_suffix: Option<&'static str>,
}

const TABLE: &[OptionDef] = &[
    OptionDef {
        setting: Setting::Image,
        name: c"container-image",
        display_name: "--container-image",
        arginfo: Some(c"[USER@][REGISTRY#]IMAGE[:TAG]|PATH"),
        usage: c"[berth] the image to run the job's tasks in: a registry image or a squashfs file",
        env_suffix: Some("IMAGE"),
    },
    OptionDef {
        setting: Setting::Mounts,
        name: c"container-mounts",
        display_name: "--container-mounts",
        arginfo: Some(c"SRC[:DST[:FLAGS]][,...]"),
        usage: c"[berth] mounts inside the container; SRC a path, tmpfs or umount; FLAGS joined by +: ro, rw, nosuid, nodev, noexec, [r]private, [r]slave, [r]shared, [r]unbindable",
        env_suffix: Some("MOUNTS"),
    },
    OptionDef {
        setting: Setting::Workdir,
        name: c"container-workdir",
        display_name: "--container-workdir",
        arginfo: Some(c"PATH"),
        usage: c"[berth] working directory inside the container",
        env_suffix: Some("WORKDIR"),
    },
    OptionDef {
        setting: Setting::Env,
        name: c"container-env",
        display_name: "--container-env",
        arginfo: Some(c"NAME[,NAME...]"),
        usage: c"[berth] variables whose job value wins over the image's",
        env_suffix: Some("ENV"),
    },
    OptionDef {
        setting: Setting::Unshare,
        name: c"container-unshare",
        display_name: "--container-unshare",
        arginfo: Some(c"net,ipc,uts"),
        usage: c"[berth] new namespaces of these kinds for the container",
        env_suffix: Some("UNSHARE"),
    },
    OptionDef {
        setting: Setting::Mpi,
        name: c"container-mpi",
        display_name: "--container-mpi",
        arginfo: Some(c"PROFILE"),
        usage: c"[berth] inject the host's MPI and interconnect libraries of this site profile (e.g. host; none: no profile)",
        env_suffix: Some("MPI"),
    },
    OptionDef {
        setting: Setting::Writable(true),
        name: c"container-writable",
        display_name: "--container-writable",
        arginfo: None,
        usage: c"[berth] writable root file system (changes vanish with the step; the default)",
        env_suffix: Some("WRITABLE"),
    },
    OptionDef {
        setting: Setting::Writable(false),
        name: c"container-readonly",
        display_name: "--container-readonly",
        arginfo: None,
        usage: c"[berth] read-only root file system",
        env_suffix: Some("READONLY"),
    },
    OptionDef {
        setting: Setting::MountHome(true),
        name: c"container-mount-home",
        display_name: "--container-mount-home",
        arginfo: None,
        usage: c"[berth] bind mount the user's home folder",
        env_suffix: Some("MOUNT_HOME"),
    },
    OptionDef {
        setting: Setting::MountHome(false),
        name: c"no-container-mount-home",
        display_name: "--no-container-mount-home",
        arginfo: None,
        usage: c"[berth] do not bind mount the user's home folder (the default)",
        env_suffix: None,
    },
    OptionDef {
        setting: Setting::RemapRoot(true),
        name: c"container-remap-root",
        display_name: "--container-remap-root",
        arginfo: None,
        usage: c"[berth] appear as root (uid 0) inside, without privilege on the host",
        env_suffix: Some("REMAP_ROOT"),
    },
    OptionDef {
        setting: Setting::RemapRoot(false),
        name: c"no-container-remap-root",
        display_name: "--no-container-remap-root",
        arginfo: None,
        usage: c"[berth] keep your own uid inside (the default)",
        env_suffix: None,
    },
    OptionDef {
        setting: Setting::Entrypoint(true),
        name: c"container-entrypoint",
        display_name: "--container-entrypoint",
        arginfo: None,
        usage: c"[berth] run the image ENTRYPOINT once when the container starts; tasks get the environment it sets",
        env_suffix: Some("ENTRYPOINT"),
    },
    OptionDef {
        setting: Setting::Entrypoint(false),
        name: c"no-container-entrypoint",
        display_name: "--no-container-entrypoint",
        arginfo: None,
        usage: c"[berth] do not run the image ENTRYPOINT",
        env_suffix: None,
    },
    OptionDef {
        setting: Setting::EntrypointLog,
        name: c"container-entrypoint-log",
        display_name: "--container-entrypoint-log",
        arginfo: None,
        usage: c"[berth] show the output of the image ENTRYPOINT (hidden otherwise)",
        env_suffix: Some("ENTRYPOINT_LOG"),
    },
    OptionDef {
        setting: Setting::Name,
        name: c"container-name",
        display_name: "--container-name",
        arginfo: Some(c"NAME[:auto|create|exec|no_exec]"),
        usage: c"[berth] a named container whose root changes later steps reuse; exec joins the step running it, no_exec never joins, create fails if it exists, auto (default) joins, reuses or creates",
        env_suffix: Some("NAME"),
    },
    OptionDef {
        setting: Setting::Save,
        name: c"container-save",
        display_name: "--container-save",
        arginfo: Some(c"PATH"),
        usage: c"[berth] after the step, save the container's root file system with its changes as a squashfs file at PATH on each node",
        env_suffix: Some("SAVE"),
    },
    OptionDef {
        setting: Setting::Remove,
        name: c"container-remove",
        display_name: "--container-remove",
        arginfo: Some(c"NAME[,NAME...]"),
        usage: c"[berth] remove these named containers of yours on each node of the step, then run the command on the host (srun only)",
        env_suffix: None,
    },
    OptionDef {
        setting: Setting::List,
        name: c"container-list",
        display_name: "--container-list",
        arginfo: None,
        usage: c"[berth] list your named containers on each node of the step, then run the command on the host (srun only)",
        env_suffix: None,
    },
];

static VALUES: Mutex<JobOptions> = Mutex::new(JobOptions {
    image: None,
    mounts: None,
    workdir: None,
    env: None,
    unshare: None,
    writable: None,
    mount_home: None,
    remap_root: None,
    entrypoint: None,
    entrypoint_log: None,
    name: None,
    save: None,
    mpi: None,
    remove: None,
    list: None,
});

/// Prefixes of the variables that stand in for options missing from the
/// command line, in order of precedence.
pub const ENV_PREFIXES: [&str; 2] = ["BERTH_CONTAINER_", "PYXIS_CONTAINER_"];

/// The option values given so far.
pub fn current() -> JobOptions {
    VALUES.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Registers every `--container-*` option with Slurm.
pub fn register_all(spank: &Spank) -> Result<(), SpankError> {
    for (index, def) in TABLE.iter().enumerate() {
        let mut option = ffi::spank_option {
            name: def.name.as_ptr() as *mut c_char,
            arginfo: def
                .arginfo
                .map_or(std::ptr::null_mut(), |a| a.as_ptr() as *mut c_char),
            usage: def.usage.as_ptr() as *mut c_char,
            has_arg: c_int::from(def.arginfo.is_some()),
            val: index as c_int + 1,
            cb: Some(option_callback),
        };
        spank.register_option(&mut option)?;
    }
    Ok(())
}

/// Fills every option the command line did not give from the first of
/// `BERTH_CONTAINER_<NAME>` and `PYXIS_CONTAINER_<NAME>` that `getenv` knows
/// (srun: its own environment; slurmstepd: the job's). Empty values count as unset.
pub fn apply_env_defaults(getenv: impl Fn(&str) -> Option<String>) -> Result<(), String> {
    let mut values = VALUES.lock().unwrap_or_else(|p| p.into_inner());
    for def in TABLE {
        let Some(suffix) = def.env_suffix else {
            continue;
        };
        if !values.is_unset(def.setting) {
            continue;
        }
        let found = ENV_PREFIXES.iter().find_map(|prefix| {
            let variable = format!("{prefix}{suffix}");
            getenv(&variable)
                .filter(|v| !v.is_empty())
                .map(|v| (variable, v))
        });
        let Some((variable, value)) = found else {
            continue;
        };
        let stands_for = |reason: String| {
            format!(
                "{variable}={value} (stands for {}): {reason}",
                def.display_name
            )
        };
        if def.arginfo.is_some() {
            check_value(def.setting, &value).map_err(stands_for)?;
            values.set(def.setting, value);
            continue;
        }
        // A flag: the variable is a boolean; false means "not given", except
        // for the pairs whose variable also says the opposite (as in pyxis,
        // WRITABLE=0 is read-only and READONLY=0 writable).
        let on = parse_bool(&value)
            .ok_or_else(|| stands_for("expected 1/true/yes/y or 0/false/no/n".to_string()))?;
        match (def.setting, on) {
            (setting, true) => values.set(setting, String::new()),
            (Setting::Writable(writable), false) => values.writable = Some(!writable),
            (Setting::MountHome(_), false) => values.mount_home = Some(false),
            (Setting::RemapRoot(_), false) => values.remap_root = Some(false),
            (Setting::Entrypoint(_), false) => values.entrypoint = Some(false),
            _ => {}
        }
    }
    Ok(())
}

/// The job environment variable that carries sbatch's options to the batch
/// step: a JSON list of `[option, argument]` pairs (flags: `""`). Slurm 22.05
/// to 24.04 pass SPANK options to the batch step only in variables that
/// `sbatch --export=LIST` and `--export=NONE` drop, and the batch script then
/// runs on the host; `SLURM_*` variables are always passed.
pub const BATCH_OPTIONS_VARIABLE: &str = "SLURM_SPANK_BERTH_BATCH_OPTIONS";

/// The options given (`[option, argument]`), as [`BATCH_OPTIONS_VARIABLE`]
/// carries them; `None` when none was given.
pub fn encode_given(options: &JobOptions) -> Option<String> {
    let pairs: Vec<[&str; 2]> = TABLE
        .iter()
        .filter(|def| options.is_set(def.setting))
        .map(|def| {
            let name = def.name.to_str().unwrap_or_default();
            [
                name,
                options.argument(def.setting).map_or("", String::as_str),
            ]
        })
        .collect();
    (!pairs.is_empty()).then(|| serde_json::to_string(&pairs).unwrap_or_default())
}

/// sbatch and salloc: hands this job's options to its batch step in
/// [`BATCH_OPTIONS_VARIABLE`] (in sbatch's environment, which Slurm copies
/// into the job's), or removes a value inherited from an enclosing job.
pub fn export_for_batch_step() {
    match encode_given(&current()) {
        Some(text) => std::env::set_var(BATCH_OPTIONS_VARIABLE, text),
        None => std::env::remove_var(BATCH_OPTIONS_VARIABLE),
    }
}

/// The batch step: when Slurm gave it none of berth's options although
/// sbatch had some (`text`, the value of [`BATCH_OPTIONS_VARIABLE`]), takes
/// them from there. Each value is checked again.
pub fn apply_batch_options(text: Option<&str>) -> Result<(), String> {
    let Some(text) = text.filter(|t| !t.is_empty()) else {
        return Ok(());
    };
    let mut values = VALUES.lock().unwrap_or_else(|p| p.into_inner());
    if encode_given(&values).is_some() {
        return Ok(()); // Slurm passed them on (24.05 and later, or --export=ALL)
    }
    let pairs: Vec<[String; 2]> = serde_json::from_str(text)
        .map_err(|e| format!("{BATCH_OPTIONS_VARIABLE} of this job is malformed ({e}): {text}"))?;
    for [name, value] in pairs {
        let def = TABLE
            .iter()
            .find(|d| d.name.to_bytes() == name.as_bytes())
            .ok_or_else(|| {
                format!(
                    "sbatch was given --{name}, which the berth on this node does not know: \
                     install the same berth on the nodes as on the submit host"
                )
            })?;
        if def.arginfo.is_some() {
            check_value(def.setting, &value)
                .map_err(|reason| format!("{}={value}: {reason}", def.display_name))?;
        }
        values.set(def.setting, value);
    }
    Ok(())
}

/// Checks one option value; the error names the option and the bad value.
pub fn validate(name: &str, value: &str) -> Result<(), String> {
    let def = TABLE
        .iter()
        .find(|d| d.name.to_bytes() == name.as_bytes())
        .ok_or_else(|| format!("--{name}: unknown option"))?;
    check_value(def.setting, value).map_err(|reason| format!("--{name}={value}: {reason}"))
}

/// Checks one option value; the error says what is wrong with it.
fn check_value(setting: Setting, value: &str) -> Result<(), String> {
    match setting {
        Setting::Image => ImageSource::parse(value)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Setting::Mounts => parse_mounts(value).map(|_| ()).map_err(|e| e.to_string()),
        Setting::Workdir if value.starts_with('/') => Ok(()),
        Setting::Workdir => Err(format!(
            "'{value}' is not an absolute path (write the full path inside the container)"
        )),
        Setting::Env => env_names(value).map(|_| ()).map_err(|e| format!("{e:#}")),
        Setting::Unshare => Namespace::parse_list(value).map(|_| ()),
        Setting::Name => ContainerName::parse(value).map(|_| ()),
        Setting::Save => check_save_path(value),
        Setting::Remove => crate::step::manage::parse_names(value)
            .map(|_| ())
            .map_err(|e| format!("{e:#}")),
        Setting::Mpi if value.is_empty() || value.contains('/') || value.starts_with('.') => {
            Err(format!(
                "'{value}' is not a profile name (the site's profiles are files in its inject_dir)"
            ))
        }
        _ => Ok(()),
    }
}

/// Checks a `--container-save` value: a file path, absolute or relative to
/// the job's working directory.
fn check_save_path(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("empty path; give the squashfs file to write, e.g. ./saved.sqfs".into());
    }
    if value.ends_with('/') {
        return Err("the path ends with '/'; give a file name, e.g. DIR/saved.sqfs".into());
    }
    Ok(())
}

/// The callback Slurm calls for each of berth's options, under the panic
/// guard (a panic must not abort srun or slurmstepd).
extern "C" fn option_callback(val: c_int, optarg: *const c_char, _remote: c_int) -> c_int {
    super::guard::guard("the option callback", || take_option(val, optarg))
}

/// Checks and stores the value of option number `val`.
fn take_option(val: c_int, optarg: *const c_char) -> Result<(), String> {
    let Some(def) = usize::try_from(val - 1).ok().and_then(|i| TABLE.get(i)) else {
        return Err(format!("unknown option number {val}"));
    };
    let value = if optarg.is_null() {
        String::new()
    } else {
        // SAFETY: Slurm passes the option argument as a valid C string.
        unsafe { CStr::from_ptr(optarg) }
            .to_string_lossy()
            .into_owned()
    };
    if def.arginfo.is_some() {
        // srun shows this before anything is allocated; slurmstepd logs it.
        check_value(def.setting, &value)
            .map_err(|reason| format!("{}={value}: {reason}", def.display_name))?;
    }
    if let Setting::Writable(writable) = def.setting {
        WRITABLE_FLAGS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(writable);
    }
    VALUES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .set(def.setting, value);
    Ok(())
}

/// `--container-writable` (true) and `--container-readonly` (false), in the
/// order Slurm called their callbacks.
static WRITABLE_FLAGS: Mutex<Vec<bool>> = Mutex::new(Vec::new());

/// The variables in which Slurm hands an allocation's options to the `srun`s
/// inside it (processed before srun's own command line).
const INHERITED_WRITABLE: &str = "SLURM_SPANK__SLURM_SPANK_OPTION_berth_container_writable";
const INHERITED_READONLY: &str = "SLURM_SPANK__SLURM_SPANK_OPTION_berth_container_readonly";

/// Lets the flag of the command line win when one of `--container-writable`
/// and `--container-readonly` is inherited from the allocation (`getenv`
/// knows its `SLURM_SPANK__` variable) and the other is not: Slurm calls
/// the callbacks of inherited options first in srun, and in its own order in
/// slurmstepd. With `refuse`, both on one command line (srun, sbatch,
/// salloc) are an error.
pub fn settle_writable_flags(
    getenv: impl Fn(&str) -> Option<String>,
    refuse: bool,
) -> Result<(), String> {
    let given = WRITABLE_FLAGS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let inherited_writable = getenv(INHERITED_WRITABLE).is_some();
    let inherited_readonly = getenv(INHERITED_READONLY).is_some();
    let mut own = given.clone();
    for (flag, inherited) in [(true, inherited_writable), (false, inherited_readonly)] {
        if let Some(index) = own.iter().position(|f| *f == flag).filter(|_| inherited) {
            own.remove(index);
        }
    }
    if refuse && own.contains(&true) && own.contains(&false) {
        return Err(
            "--container-readonly and --container-writable given together: keep one of them"
                .to_string(),
        );
    }
    if given.contains(&true) && given.contains(&false) {
        let writable = match (inherited_writable, inherited_readonly) {
            (false, true) => Some(true),
            (true, false) => Some(false),
            _ => None,
        };
        if let Some(writable) = writable {
            VALUES.lock().unwrap_or_else(|p| p.into_inner()).writable = Some(writable);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tests that touch the global values run one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn reset() {
        *VALUES.lock().unwrap() = JobOptions::default();
    }

    #[test]
    fn batch_options_go_through_their_variable() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        reset();
        let given = JobOptions {
            image: Some("reg:5000/busybox:1".into()),
            mounts: Some("/a:/b:ro,/c".into()),
            writable: Some(false),
            remap_root: Some(true),
            mount_home: Some(false),
            ..Default::default()
        };
        let text = encode_given(&given).unwrap();
        assert!(encode_given(&JobOptions::default()).is_none());
        apply_batch_options(Some(&text)).unwrap();
        assert_eq!(current(), given);
        // What Slurm gave wins: the variable is not looked at then.
        reset();
        VALUES.lock().unwrap().image = Some("other".into());
        apply_batch_options(Some(&text)).unwrap();
        assert_eq!(current().image.as_deref(), Some("other"));
        assert_eq!(current().mounts, None);
        // Values are checked again; unknown options are named.
        reset();
        let e = apply_batch_options(Some(r#"[["container-workdir","rel"]]"#)).unwrap_err();
        assert!(e.contains("--container-workdir=rel"), "{e}");
        let e = apply_batch_options(Some(r#"[["container-future","x"]]"#)).unwrap_err();
        assert!(
            e.contains("--container-future") && e.contains("same berth"),
            "{e}"
        );
        assert!(apply_batch_options(Some("not json")).is_err());
        reset();
        apply_batch_options(None).unwrap();
        assert_eq!(current(), JobOptions::default());
    }

    #[test]
    fn validation_names_option_and_value() {
        let e = validate("container-image", "Bad Image").unwrap_err();
        assert!(
            e.starts_with("--container-image=Bad Image: invalid image reference"),
            "{e}"
        );
        let e = validate("container-workdir", "rel/dir").unwrap_err();
        assert!(e.contains("--container-workdir=rel/dir"), "{e}");
        assert!(validate("container-image", "ubuntu:22.04").is_ok());
        assert!(validate("container-workdir", "/work").is_ok());
        let e = validate("container-mounts", "relative:/x").unwrap_err();
        assert!(e.starts_with("--container-mounts=relative:/x: "), "{e}");
        let e = validate("container-unshare", "net,pid").unwrap_err();
        assert!(e.contains("pid"), "{e}");
        let e = validate("container-env", "OK,1BAD").unwrap_err();
        assert!(e.contains("1BAD"), "{e}");
        let e = validate("container-name", "x:join").unwrap_err();
        assert!(
            e.starts_with("--container-name=x:join: unknown flag"),
            "{e}"
        );
        assert!(validate("container-name", "x:no_exec").is_ok());
        let e = validate("container-save", "/tmp/dir/").unwrap_err();
        assert!(e.contains("ends with '/'"), "{e}");
        assert!(validate("container-save", "saved.sqfs").is_ok());
    }

    #[test]
    fn environment_fills_missing_options() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        reset();
        let env = |name: &str| match name {
            "PYXIS_CONTAINER_IMAGE" => Some("ubuntu:22.04".to_string()),
            "BERTH_CONTAINER_WORKDIR" => Some("/work".to_string()),
            "PYXIS_CONTAINER_WORKDIR" => Some("/ignored".to_string()),
            "PYXIS_CONTAINER_MOUNTS" => Some(String::new()),
            "PYXIS_CONTAINER_READONLY" => Some("yes".to_string()),
            "PYXIS_CONTAINER_MOUNT_HOME" => Some("0".to_string()),
            _ => None,
        };
        apply_env_defaults(env).unwrap();
        let values = current();
        assert_eq!(values.image.as_deref(), Some("ubuntu:22.04"));
        assert_eq!(values.workdir.as_deref(), Some("/work"));
        assert_eq!(values.mounts, None);
        assert_eq!(values.writable, Some(false));
        assert_eq!(values.mount_home, Some(false));
        assert_eq!(values.remap_root, None);
        // The command line wins over the environment.
        reset();
        VALUES.lock().unwrap().set(Setting::Image, "busybox".into());
        VALUES
            .lock()
            .unwrap()
            .set(Setting::Writable(true), String::new());
        apply_env_defaults(env).unwrap();
        assert_eq!(current().image.as_deref(), Some("busybox"));
        assert_eq!(current().writable, Some(true));
        reset();
        let e = apply_env_defaults(|n| (n == "PYXIS_CONTAINER_IMAGE").then(|| "Bad Ref".into()))
            .unwrap_err();
        assert!(
            e.starts_with("PYXIS_CONTAINER_IMAGE=Bad Ref (stands for --container-image): "),
            "{e}"
        );
        reset();
        let e = apply_env_defaults(|n| (n == "BERTH_CONTAINER_REMAP_ROOT").then(|| "maybe".into()))
            .unwrap_err();
        assert!(e.contains("BERTH_CONTAINER_REMAP_ROOT=maybe"), "{e}");
        reset();
        let entrypoint = |value: &'static str| {
            move |n: &str| match n {
                "PYXIS_CONTAINER_ENTRYPOINT" => Some(value.to_string()),
                "PYXIS_CONTAINER_ENTRYPOINT_LOG" => Some("y".to_string()),
                _ => None,
            }
        };
        apply_env_defaults(entrypoint("no")).unwrap();
        assert_eq!(current().entrypoint, Some(false));
        assert_eq!(current().entrypoint_log, Some(true));
        reset();
        apply_env_defaults(entrypoint("TRUE")).unwrap();
        assert_eq!(current().entrypoint, Some(true));
        reset();
        VALUES
            .lock()
            .unwrap()
            .set(Setting::Entrypoint(false), String::new());
        apply_env_defaults(entrypoint("1")).unwrap();
        assert_eq!(current().entrypoint, Some(false), "the command line wins");
        reset();
    }

    #[test]
    fn false_writable_and_readonly_variables_say_the_opposite() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        for (variable, value, writable) in [
            ("PYXIS_CONTAINER_WRITABLE", "0", Some(false)),
            ("PYXIS_CONTAINER_WRITABLE", "1", Some(true)),
            ("PYXIS_CONTAINER_READONLY", "no", Some(true)),
            ("PYXIS_CONTAINER_READONLY", "yes", Some(false)),
            ("BERTH_CONTAINER_WRITABLE", "false", Some(false)),
            ("BERTH_CONTAINER_READONLY", "n", Some(true)),
        ] {
            reset();
            apply_env_defaults(|n| (n == variable).then(|| value.to_string())).unwrap();
            assert_eq!(current().writable, writable, "{variable}={value}");
        }
        // The command line still wins.
        reset();
        VALUES
            .lock()
            .unwrap()
            .set(Setting::Writable(true), String::new());
        apply_env_defaults(|n| (n == "PYXIS_CONTAINER_WRITABLE").then(|| "0".into())).unwrap();
        assert_eq!(current().writable, Some(true));
        reset();
    }

    #[test]
    fn readonly_and_writable_together_are_refused_unless_one_is_inherited() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let given = |flags: &[bool]| {
            reset();
            *WRITABLE_FLAGS.lock().unwrap() = flags.to_vec();
            if let Some(last) = flags.last() {
                VALUES.lock().unwrap().writable = Some(*last);
            }
        };
        let none = |_: &str| None;
        given(&[true, false]);
        let e = settle_writable_flags(none, true).unwrap_err();
        assert!(
            e.contains("--container-readonly and --container-writable"),
            "{e}"
        );
        given(&[false, true]);
        assert!(settle_writable_flags(none, true).is_err());
        given(&[true, true]);
        assert!(settle_writable_flags(none, true).is_ok());
        given(&[false]);
        assert!(settle_writable_flags(none, true).is_ok());
        assert_eq!(current().writable, Some(false));
        // sbatch --container-readonly, then srun --container-writable inside,
        // in either order of the callbacks: the srun's flag wins.
        let inherited = |n: &str| (n == INHERITED_READONLY).then(|| "(null)".to_string());
        for order in [[false, true], [true, false]] {
            given(&order);
            assert!(settle_writable_flags(inherited, true).is_ok(), "{order:?}");
            assert_eq!(current().writable, Some(true), "{order:?}");
        }
        // ... but both on srun's own command line still conflict.
        given(&[false, false, true]);
        assert!(settle_writable_flags(inherited, true).is_err());
        // slurmstepd may see the inherited flag twice; it never refuses.
        given(&[true, false, false]);
        assert!(settle_writable_flags(inherited, false).is_ok());
        assert_eq!(current().writable, Some(true));
        given(&[]);
        assert!(settle_writable_flags(none, true).is_ok());
        assert_eq!(current().writable, None);
    }

    #[test]
    fn empty_environment_names_are_refused() {
        for value in ["", " ", "FOO,", ",FOO", "FOO,,BAR"] {
            let e = validate("container-env", value).unwrap_err();
            assert!(e.contains("--container-env="), "{value:?}: {e}");
            assert!(e.contains("NAME[,NAME...]"), "{value:?}: {e}");
        }
        assert_eq!(env_names("FOO, BAR").unwrap(), vec!["FOO", "BAR"]);
    }

    #[test]
    fn options_without_image_are_listed() {
        let options = JobOptions {
            mount_home: Some(true),
            unshare: Some("net".into()),
            ..Default::default()
        };
        assert_eq!(
            options.given_without_image(),
            vec!["--container-unshare", "--container-mount-home"]
        );
    }

    #[test]
    fn table_names_fit_slurm_limit() {
        for def in TABLE {
            // SPANK_OPTION_MAXLEN in spank.h
            assert!(def.name.to_bytes().len() < ffi::SPANK_OPTION_MAXLEN as usize);
            assert_eq!(
                format!("--{}", def.name.to_string_lossy()),
                def.display_name
            );
        }
    }
}
