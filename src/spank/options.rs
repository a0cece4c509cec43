//! The `--container-*` options: one table, one callback, the values a job gave.

use std::ffi::{c_char, c_int, CStr};
use std::sync::Mutex;

use super::ffi;
use super::handle::{self, Spank, SpankError};
use crate::container::spec::parse_mounts;
use crate::reference::ImageSource;

/// The values of the `--container-*` options for this job or step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobOptions {
    /// `--container-image`
    pub image: Option<String>,
    /// `--container-mounts`
    pub mounts: Option<String>,
    /// `--container-workdir`
    pub workdir: Option<String>,
}

impl JobOptions {
    /// True when any option was given.
    pub fn any(&self) -> bool {
        self.image.is_some() || self.mounts.is_some() || self.workdir.is_some()
    }
}

/// Identifies an option in Slurm's callback (`val`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
enum OptionId {
    Image = 1,
    Mounts = 2,
    Workdir = 3,
}

struct OptionDef {
    id: OptionId,
    /// `IMAGE` for `PYXIS_CONTAINER_IMAGE` and `BERTH_CONTAINER_IMAGE`.
    env_suffix: &'static str,
    name: &'static CStr,
    arginfo: &'static CStr,
    usage: &'static CStr,
}

const TABLE: &[OptionDef] = &[
    OptionDef {
        id: OptionId::Image,
        env_suffix: "IMAGE",
        name: c"container-image",
        arginfo: c"[USER@][REGISTRY#]IMAGE[:TAG]|PATH",
        usage: c"[berth] the image to run the job's tasks in: a registry image or a squashfs file",
    },
    OptionDef {
        id: OptionId::Mounts,
        env_suffix: "MOUNTS",
        name: c"container-mounts",
        arginfo: c"SRC:DST[:FLAGS][,SRC:DST...]",
        usage: c"[berth] bind mount[s] inside the container; flag: ro (read-only)",
    },
    OptionDef {
        id: OptionId::Workdir,
        env_suffix: "WORKDIR",
        name: c"container-workdir",
        arginfo: c"PATH",
        usage: c"[berth] working directory inside the container",
    },
];

static VALUES: Mutex<JobOptions> = Mutex::new(JobOptions {
    image: None,
    mounts: None,
    workdir: None,
});

/// Prefixes of the variables that stand in for options missing from the
/// command line, in order of precedence.
pub const ENV_PREFIXES: [&str; 2] = ["BERTH_CONTAINER_", "PYXIS_CONTAINER_"];

/// Fills every option the command line did not give from the first of
/// `BERTH_CONTAINER_<NAME>` and `PYXIS_CONTAINER_<NAME>` that `getenv` knows
/// (srun: its own environment; slurmstepd: the job's). Empty values count as unset.
pub fn apply_env_defaults(getenv: impl Fn(&str) -> Option<String>) -> Result<(), String> {
    let given = current();
    for def in TABLE {
        let already = match def.id {
            OptionId::Image => given.image.is_some(),
            OptionId::Mounts => given.mounts.is_some(),
            OptionId::Workdir => given.workdir.is_some(),
        };
        if already {
            continue;
        }
        let found = ENV_PREFIXES.iter().find_map(|prefix| {
            let variable = format!("{prefix}{}", def.env_suffix);
            getenv(&variable)
                .filter(|v| !v.is_empty())
                .map(|v| (variable, v))
        });
        let Some((variable, value)) = found else {
            continue;
        };
        let name = def.name.to_string_lossy();
        check_value(&name, &value)
            .map_err(|reason| format!("{variable}={value} (stands for --{name}): {reason}"))?;
        store(def.id, value);
    }
    Ok(())
}

/// The option values given so far.
pub fn current() -> JobOptions {
    VALUES.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Registers every `--container-*` option with Slurm.
pub fn register_all(spank: &Spank) -> Result<(), SpankError> {
    for def in TABLE {
        let mut option = ffi::spank_option {
            name: def.name.as_ptr() as *mut c_char,
            arginfo: def.arginfo.as_ptr() as *mut c_char,
            usage: def.usage.as_ptr() as *mut c_char,
            has_arg: 1,
            val: def.id as c_int,
            cb: Some(option_callback),
        };
        spank.register_option(&mut option)?;
    }
    Ok(())
}

/// Checks one option value; the error names the option and the bad value.
pub fn validate(name: &str, value: &str) -> Result<(), String> {
    check_value(name, value).map_err(|reason| format!("--{name}={value}: {reason}"))
}

/// Checks one option value; the error says what is wrong with it.
fn check_value(name: &str, value: &str) -> Result<(), String> {
    match name {
        "container-image" => ImageSource::parse(value)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "container-mounts" => parse_mounts(value).map(|_| ()).map_err(|e| e.to_string()),
        "container-workdir" => {
            if value.starts_with('/') {
                Ok(())
            } else {
                Err(format!(
                    "'{value}' is not an absolute path (write the full path inside the container)"
                ))
            }
        }
        _ => Err("unknown option".to_string()),
    }
}

fn store(id: OptionId, value: String) {
    let mut values = VALUES.lock().unwrap_or_else(|p| p.into_inner());
    match id {
        OptionId::Image => values.image = Some(value),
        OptionId::Mounts => values.mounts = Some(value),
        OptionId::Workdir => values.workdir = Some(value),
    }
}

extern "C" fn option_callback(val: c_int, optarg: *const c_char, _remote: c_int) -> c_int {
    let Some(def) = TABLE.iter().find(|d| d.id as c_int == val) else {
        return -1;
    };
    let name = def.name.to_string_lossy();
    let value = if optarg.is_null() {
        String::new()
    } else {
        // SAFETY: Slurm passes the option argument as a valid C string.
        unsafe { CStr::from_ptr(optarg) }
            .to_string_lossy()
            .into_owned()
    };
    if let Err(message) = validate(&name, &value) {
        // srun shows this before anything is allocated; slurmstepd logs it.
        handle::log_error(&message);
        return -1;
    }
    store(def.id, value);
    0
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn environment_fills_missing_options() {
        let env = |name: &str| match name {
            "PYXIS_CONTAINER_IMAGE" => Some("ubuntu:22.04".to_string()),
            "BERTH_CONTAINER_WORKDIR" => Some("/work".to_string()),
            "PYXIS_CONTAINER_WORKDIR" => Some("/ignored".to_string()),
            "PYXIS_CONTAINER_MOUNTS" => Some(String::new()),
            _ => None,
        };
        apply_env_defaults(env).unwrap();
        let values = current();
        assert_eq!(values.image.as_deref(), Some("ubuntu:22.04"));
        assert_eq!(values.workdir.as_deref(), Some("/work"));
        assert_eq!(values.mounts, None);
        // The command line wins over the environment.
        store(OptionId::Image, "busybox".into());
        apply_env_defaults(env).unwrap();
        assert_eq!(current().image.as_deref(), Some("busybox"));
        *VALUES.lock().unwrap() = JobOptions::default();
        let e = apply_env_defaults(|n| (n == "PYXIS_CONTAINER_IMAGE").then(|| "Bad Ref".into()))
            .unwrap_err();
        assert!(
            e.starts_with("PYXIS_CONTAINER_IMAGE=Bad Ref (stands for --container-image): "),
            "{e}"
        );
        *VALUES.lock().unwrap() = JobOptions::default();
    }

    #[test]
    fn table_names_fit_slurm_limit() {
        for def in TABLE {
            // SPANK_OPTION_MAXLEN in spank.h
            assert!(def.name.to_bytes().len() < ffi::SPANK_OPTION_MAXLEN as usize);
        }
    }
}
