//! enroot's site configuration, read as it is where present, so a pyxis +
//! enroot site keeps its settings under berth (issue 14, point 3): in the
//! folder `enroot_config_path` (default `/etc/enroot`), `enroot.conf` and
//! `enroot.conf.d/*.conf` (the container defaults pyxis users see:
//! [`conf::Defaults`]), `mounts.d/*.fstab` (site binds and tmpfs:
//! [`fstab`]), `environ.d/*.env` (variables: [`environ`]) and
//! `hooks.d/*.sh` (the site's hooks, run by the holder: [`hooks`]; of
//! enroot's bundled hooks, berth does the work of [`sharp`] and [`localtime`]
//! itself).
//!
//! Owns: reading and parsing those files into typed data. The plugin
//! applies it when it builds a step's container spec: an option on the job
//! wins over a default, site mounts come before `--container-mounts`, site
//! variables over the image's. What berth does not take over is named in
//! [`EnrootSite::summary`], one line for the log.
//!
//! Root reads only root's files that no one else can write, in folders that
//! root owns up to `/` ([`crate::root_files`]); anything else is left out and
//! named.

pub mod conf;
pub mod environ;
pub mod hooks;
pub mod localtime;
pub mod sharp;
/// enroot's fstab parser lives in the container layer (the holder parses
/// what site hooks append with it too).
pub use crate::container::fstab;

use std::path::Path;

use crate::container::usermount::UserMount;
use crate::root_files;

/// What a site's enroot configuration gives a container.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct EnrootSite {
    /// Defaults from `enroot.conf`.
    pub defaults: conf::Defaults,
    /// Mounts from `mounts.d`, in file order.
    pub mounts: Vec<UserMount>,
    /// Variables from `environ.d` (`NAME=VALUE`), in file order.
    pub env: Vec<String>,
    /// `enroot.conf` names berth does not use.
    pub unused: Vec<String>,
    /// Every `enroot.conf` setting (`NAME=VALUE`), for the hooks.
    pub settings: Vec<String>,
    /// The hooks of `hooks.d`.
    pub hooks: hooks::Listed,
    /// `mounts.d` targets berth makes itself.
    pub left_to_berth: Vec<String>,
    /// Files and lines left out, and why.
    pub notes: Vec<String>,
}

impl EnrootSite {
    /// Reads the folder `dir` (nothing when it is missing). `${NAME}` in
    /// `mounts.d` and `environ.d` is looked up with `lookup` (the job's
    /// environment); `exists` decides `nofail` binds.
    pub fn load(
        dir: &Path,
        lookup: &dyn Fn(&str) -> Option<String>,
        exists: &dyn Fn(&Path) -> bool,
    ) -> EnrootSite {
        let mut site = EnrootSite::default();
        match root_files::trusted_dir(dir) {
            Ok(true) => {}
            Ok(false) => return site,
            Err(why) => {
                site.notes.push(why);
                return site;
            }
        }
        let read = conf_files_of(dir, &mut site);
        site.defaults = read.defaults;
        site.unused = read.unused;
        site.settings = read.settings;
        site.notes.extend(read.notes);
        let mut parsed = fstab::Parsed::default();
        for path in site.listed(&dir.join("mounts.d"), ".fstab") {
            if let Some(text) = site.read(&path) {
                fstab::parse(
                    &text,
                    &path.display().to_string(),
                    lookup,
                    exists,
                    &mut parsed,
                );
            }
        }
        site.mounts = parsed.mounts;
        site.left_to_berth = parsed.left_to_berth;
        site.notes.extend(parsed.notes);
        for path in site.listed(&dir.join("environ.d"), ".env") {
            if let Some(text) = site.read(&path) {
                site.env.extend(environ::parse(&text, lookup));
            }
        }
        let hooks_dir = dir.join("hooks.d");
        match root_files::trusted_dir(&hooks_dir) {
            Ok(true) => site.hooks = hooks::list(&hooks_dir, &mut site.notes),
            Ok(false) => {}
            Err(why) => site.notes.push(why),
        }
        site
    }

    /// What `enroot.conf` and `enroot.conf.d/*.conf` of `dir` set, as
    /// root may read them (nothing when the folder is missing or may not be
    /// used); the notes say what was left out and why.
    pub fn read_conf(dir: &Path) -> (conf::Read, Vec<String>) {
        let mut site = EnrootSite::default();
        let read = match root_files::trusted_dir(dir) {
            Ok(true) => conf_files_of(dir, &mut site),
            Ok(false) => conf::Read::default(),
            Err(why) => {
                site.notes.push(why);
                conf::Read::default()
            }
        };
        (read, site.notes)
    }

    /// The text of `path` when it may be used; else a note.
    fn read(&mut self, path: &Path) -> Option<String> {
        match root_files::read_trusted(path) {
            Ok(text) => text,
            Err(why) => {
                self.notes.push(why);
                None
            }
        }
    }

    /// The files of the subfolder `dir` ending in `suffix`, when the folder
    /// may be used; else a note.
    fn listed(&mut self, dir: &Path, suffix: &str) -> Vec<std::path::PathBuf> {
        match root_files::trusted_dir(dir) {
            Ok(true) => root_files::listed(dir, suffix),
            Ok(false) => Vec::new(),
            Err(why) => {
                self.notes.push(why);
                Vec::new()
            }
        }
    }

    /// One line saying what berth does not take over from `dir`; `None`
    /// when it takes everything.
    pub fn summary(&self, dir: &Path) -> Option<String> {
        let mut parts = Vec::new();
        if !self.unused.is_empty() {
            parts.push(format!(
                "enroot.conf settings not used by berth: {}",
                self.unused.join(", ")
            ));
        }
        if !self.left_to_berth.is_empty() {
            parts.push(format!(
                "mounts berth makes itself: {}",
                self.left_to_berth.join(", ")
            ));
        }
        parts.extend(self.hooks.skipped_line());
        parts.extend(self.notes.iter().cloned());
        (!parts.is_empty()).then(|| format!("{}: {}", dir.display(), parts.join("; ")))
    }
}

/// Reads the configuration files of the trusted folder `dir`, in enroot's
/// order; what cannot be used goes to `site`'s notes.
fn conf_files_of(dir: &Path, site: &mut EnrootSite) -> conf::Read {
    let mut conf_files = vec![dir.join("enroot.conf")];
    conf_files.extend(root_files::listed(&dir.join("enroot.conf.d"), ".conf"));
    let mut read = conf::Read::default();
    for path in conf_files {
        if let Some(text) = site.read(&path) {
            conf::parse(&text, &mut read);
        }
    }
    read
}

#[cfg(test)]
mod tests;
