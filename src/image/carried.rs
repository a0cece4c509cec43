//! The image configuration a squashfs file carries in its own root, so that
//! a file made by `--container-save` or by `enroot import` runs like the
//! image it came from (`PATH` and the rest of `Env`, `WorkingDir`,
//! `ENTRYPOINT`, `CMD`).
//!
//! Two places, read in this order ([`read`]):
//!
//! - berth's: [`BERTH_CONFIG`], an OCI image configuration (`{"config":
//!   {"Env": [...], "WorkingDir": ..., "Entrypoint": [...], "Cmd": [...],
//!   "User": ..., "Labels": {...}}}`);
//! - enroot's (its `doc/image-format.md`): [`ENROOT_ENVIRONMENT`], one
//!   `NAME=VALUE` a line, and [`ENROOT_RC`], the shell script `enroot
//!   import` writes: `cd "WORKDIR"`, then `exec ENTRYPOINT... "$@"` when
//!   the container is started with arguments, else `exec ENTRYPOINT...
//!   CMD...`; the image's labels are `# KEY VALUE` comments at its top.
//!
//! [`files`] writes both places for `--container-save`. Everything here is
//! pure: bytes in, typed data and notes out. Whoever calls [`read`] reads
//! bytes of a user's file, so it runs as the pull user or as the user,
//! never as root.

use std::collections::BTreeMap;

use super::shellwords::{self, Word};
use super::ImageConfig;

/// berth's place: an OCI image configuration (path in the image root).
pub const BERTH_CONFIG: &str = "/.berth/image-config.json";
/// enroot's environment file.
pub const ENROOT_ENVIRONMENT: &str = "/etc/environment";
/// enroot's start script.
pub const ENROOT_RC: &str = "/etc/rc";

/// What [`read`] found: the config (`None`: the file carries none) and one
/// line for each thing in it that berth could not take over.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// The configuration, when the file carries one.
    pub config: Option<ImageConfig>,
    /// Where it was found ([`BERTH_CONFIG`] or [`ENROOT_RC`]).
    pub source: Option<&'static str>,
    /// What was left out, and why (for one log line).
    pub notes: Vec<String>,
}

/// Reads the configuration carried in an image root through `read_file`
/// (a path in the root -> its bytes, `None` when it is no regular file):
/// berth's place first, then enroot's.
pub fn read(mut read_file: impl FnMut(&str) -> Option<Vec<u8>>) -> Found {
    let mut notes = Vec::new();
    if let Some(bytes) = read_file(BERTH_CONFIG) {
        match ImageConfig::from_oci_json(&bytes) {
            Ok(config) => {
                return Found {
                    config: Some(config),
                    source: Some(BERTH_CONFIG),
                    notes,
                }
            }
            Err(e) => notes.push(format!(
                "{BERTH_CONFIG} is not an image configuration ({e})"
            )),
        }
    }
    let Some(rc) = read_file(ENROOT_RC) else {
        return Found {
            notes,
            ..Found::default()
        };
    };
    let mut config = from_enroot_rc(&String::from_utf8_lossy(&rc), &mut notes);
    if let Some(environment) = read_file(ENROOT_ENVIRONMENT) {
        config.env = from_enroot_environment(&String::from_utf8_lossy(&environment));
    }
    Found {
        config: Some(config),
        source: Some(ENROOT_RC),
        notes,
    }
}

/// The variables of an enroot `/etc/environment`, as enroot takes them:
/// leading blanks, comments, empty lines, lines that are no `NAME=VALUE`
/// and `ENROOT_*` names dropped, one pair of quotes around a value removed.
/// (enroot also replaces `${NAME}` with the host's value at start; berth
/// keeps such text as it is.)
pub fn from_enroot_environment(text: &str) -> Vec<String> {
    text.lines()
        .map(|line| line.trim_start())
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| {
            let (name, value) = line.split_once('=')?;
            let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid || name.starts_with("ENROOT_") {
                return None;
            }
            Some(format!("{name}={}", unquote(value)))
        })
        .collect()
}

/// `value` without one pair of surrounding quotes (then trailing blanks go too).
fn unquote(value: &str) -> &str {
    let trimmed = value.trim_end();
    let quoted =
        trimmed.len() >= 2 && trimmed.starts_with(['"', '\'']) && trimmed.ends_with(['"', '\'']);
    if quoted {
        &trimmed[1..trimmed.len() - 1]
    } else {
        value
    }
}

/// The working directory, ENTRYPOINT, CMD and labels of an enroot `/etc/rc`;
/// what it cannot read goes to `notes`.
pub fn from_enroot_rc(text: &str, notes: &mut Vec<String>) -> ImageConfig {
    let mut config = ImageConfig::default();
    let mut with_args = None;
    let mut without_args = None;
    let mut in_header = true;
    for line in text.lines().map(str::trim) {
        if in_header {
            if let Some(label) = line.strip_prefix("# ") {
                if !label.starts_with("enroot-provenance:") {
                    let (key, value) = label.split_once(' ').unwrap_or((label, ""));
                    config.labels.insert(key.to_string(), value.to_string());
                }
                continue;
            }
            in_header = line.starts_with('#');
        }
        if let Some(dir) = line
            .strip_prefix("cd ")
            .and_then(|l| l.strip_suffix(" && unset OLDPWD || exit 1"))
        {
            match shellwords::split(dir).as_deref() {
                Ok([Word::Text(dir)]) => {
                    config.working_dir = Some(dir.clone()).filter(|d| d != "/" && !d.is_empty())
                }
                _ => notes.push(format!(
                    "{ENROOT_RC}: cannot read the working directory {dir}"
                )),
            }
        } else if let Some(command) = line.strip_prefix("exec ") {
            match shellwords::split(command) {
                Ok(mut words) if words.last() == Some(&Word::AllArgs) => {
                    words.pop();
                    with_args = Some(texts(words));
                }
                Ok(words) => without_args = Some(texts(words)),
                Err(why) => notes.push(format!("{ENROOT_RC}: cannot read `exec {command}`: {why}")),
            }
        }
    }
    match (with_args.flatten(), without_args.flatten()) {
        (Some(entrypoint), Some(all)) => {
            if let Some(cmd) = all.strip_prefix(entrypoint.as_slice()) {
                config.cmd = Some(cmd.to_vec()).filter(|c| !c.is_empty());
            } else {
                notes.push(format!(
                    "{ENROOT_RC}: its two exec lines disagree on the ENTRYPOINT; CMD left out"
                ));
            }
            config.entrypoint = Some(entrypoint).filter(|e| !e.is_empty());
        }
        _ => notes.push(format!(
            "{ENROOT_RC} is not in the form `enroot import` writes (`exec ... \"$@\"` and \
             `exec ...`): the image's ENTRYPOINT and CMD are not known"
        )),
    }
    config
}

/// The words, when all are literal text.
fn texts(words: Vec<Word>) -> Option<Vec<String>> {
    words
        .into_iter()
        .map(|w| match w {
            Word::Text(t) => Some(t),
            Word::AllArgs => None,
        })
        .collect()
}

/// One file [`files`] puts into a saved image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CarriedFile {
    /// Its path in the image root.
    pub path: &'static str,
    /// Its content.
    pub bytes: Vec<u8>,
}

/// The files that carry `config` in both places, for `--container-save`:
/// berth's JSON, and enroot's environment and start script (which enroot
/// runs as they are: the working directory, then ENTRYPOINT with the start
/// arguments or with CMD). An `Env` entry with a line break cannot be one
/// line of enroot's file: it is left out of that file only, with a note.
pub fn files(config: &ImageConfig) -> (Vec<CarriedFile>, Vec<String>) {
    let mut notes = Vec::new();
    let json = serde_json::json!({
        "config": {
            "Env": config.env,
            "WorkingDir": config.working_dir.clone().unwrap_or_default(),
            "Entrypoint": config.entrypoint,
            "Cmd": config.cmd,
            "User": config.user.clone().unwrap_or_default(),
            "Labels": config.labels,
        }
    });
    let mut environment = String::new();
    for entry in &config.env {
        if entry.contains(['\n', '\r']) {
            let name = entry.split('=').next().unwrap_or_default();
            notes.push(format!(
                "{name} has a line break: left out of {ENROOT_ENVIRONMENT} (kept in {BERTH_CONFIG})"
            ));
        } else {
            environment.push_str(entry);
            environment.push('\n');
        }
    }
    let files = vec![
        CarriedFile {
            path: BERTH_CONFIG,
            bytes: serde_json::to_vec_pretty(&json).expect("a JSON value always serializes"),
        },
        CarriedFile {
            path: ENROOT_ENVIRONMENT,
            bytes: environment.into_bytes(),
        },
        CarriedFile {
            path: ENROOT_RC,
            bytes: enroot_rc(config).into_bytes(),
        },
    ];
    (files, notes)
}

/// An `/etc/rc` that enroot runs like the one `enroot import` writes, and
/// that [`from_enroot_rc`] reads back.
fn enroot_rc(config: &ImageConfig) -> String {
    let words = |list: &Option<Vec<String>>| -> Vec<String> {
        list.iter()
            .flatten()
            .map(|w| shellwords::quote(w))
            .collect()
    };
    let entrypoint = words(&config.entrypoint);
    let mut cmd = words(&config.cmd);
    if entrypoint.is_empty() && cmd.is_empty() {
        cmd.push(shellwords::quote("/bin/sh"));
    }
    let workdir = shellwords::quote_double(config.working_dir.as_deref().unwrap_or("/"));
    let labels = labels_as_comments(&config.labels);
    let with_args = entrypoint.iter().map(String::as_str).chain(["\"$@\""]);
    let without_args = entrypoint.iter().chain(&cmd).map(String::as_str);
    format!(
        "{labels}\n\
         # The image's working directory, ENTRYPOINT and CMD, written by berth --container-save.\n\
         mkdir -p {workdir} 2> /dev/null\n\
         cd {workdir} && unset OLDPWD || exit 1\n\
         \n\
         if [ -s /etc/rc.local ]; then\n    . /etc/rc.local\nfi\n\
         \n\
         if [ $# -gt 0 ]; then\n    exec {}\nelse\n    exec {}\nfi\n",
        with_args.collect::<Vec<_>>().join(" "),
        without_args.collect::<Vec<_>>().join(" "),
    )
}

/// Labels as `# KEY VALUE` lines (line breaks in values become spaces).
fn labels_as_comments(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .filter(|(key, _)| !key.is_empty() && !key.contains(char::is_whitespace))
        .map(|(key, value)| format!("# {key} {}\n", value.replace(['\n', '\r'], " ")))
        .collect()
}

#[cfg(test)]
#[path = "carried_tests.rs"]
mod tests;
