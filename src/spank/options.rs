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
    name: &'static CStr,
    arginfo: &'static CStr,
    usage: &'static CStr,
}

const TABLE: &[OptionDef] = &[
    OptionDef {
        id: OptionId::Image,
        name: c"container-image",
        arginfo: c"[USER@][REGISTRY#]IMAGE[:TAG]|PATH",
        usage: c"[berth] the image to run the job's tasks in: a registry image or a squashfs file",
    },
    OptionDef {
        id: OptionId::Mounts,
        name: c"container-mounts",
        arginfo: c"SRC:DST[:FLAGS][,SRC:DST...]",
        usage: c"[berth] bind mount[s] inside the container; flag: ro (read-only)",
    },
    OptionDef {
        id: OptionId::Workdir,
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
    let result = match name {
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
    };
    result.map_err(|e| format!("--{name}={value}: {e}"))
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
    fn table_names_fit_slurm_limit() {
        for def in TABLE {
            // SPANK_OPTION_MAXLEN in spank.h
            assert!(def.name.to_bytes().len() < ffi::SPANK_OPTION_MAXLEN as usize);
        }
    }
}
