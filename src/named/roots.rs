//! The on-disk part of named containers: one folder per container on
//! node-local storage, `<store>/containers/<uid>/job-<JOB>/<NAME>/` (scope
//! `job`) or `<store>/containers/<uid>/global/<NAME>/` (scope `global`), with
//!
//! - `meta.json`: what it was made from (image, manifest digest, squashfs);
//! - `upper/`, `work/`: the overlay's upper and work folders, which keep the
//!   changes made to the root between steps;
//! - `lock`: every step using the container holds a shared `flock` on it, so
//!   `berth containers rm` leaves a container in use alone.
//!
//! Everything below `<store>/containers/<uid>` belongs to root and is closed to
//! others (mode 0700): a user cannot see another user's containers, nor swap a
//! folder of their own for a symbolic link under the overlay root mounts.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::fsutil::{lock_shared, try_lock_exclusive};

/// The folder below the store that holds named containers.
pub const CONTAINERS_DIR: &str = "containers";

/// How long a named container lives (plugstack `container_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Until the end of this job (removed by the job epilog).
    Job(u32),
    /// Until removed with `berth containers rm`.
    Global,
}

/// Which named container: whose, in which scope, by which name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedKey {
    /// The owner's uid.
    pub uid: u32,
    /// Job or global.
    pub scope: Scope,
    /// The name (checked by [`crate::named::check_name`]).
    pub name: String,
}

impl NamedKey {
    /// The container's folder relative to the containers folder.
    fn relative_dir(&self) -> PathBuf {
        PathBuf::from(self.uid.to_string())
            .join(scope_dir(self.scope))
            .join(&self.name)
    }

    /// A unique single-component label (`<uid>.job-<JOB>.<name>`), for
    /// runtime files.
    pub fn label(&self) -> String {
        format!("{}.{}.{}", self.uid, scope_dir(self.scope), self.name)
    }

    /// How users see it in messages: `'NAME'` or `'NAME' (job JOB)`.
    pub fn describe(&self) -> String {
        match self.scope {
            Scope::Job(job) => format!("'{}' (job {job})", self.name),
            Scope::Global => format!("'{}'", self.name),
        }
    }
}

fn scope_dir(scope: Scope) -> String {
    match scope {
        Scope::Job(job) => format!("job-{job}"),
        Scope::Global => "global".to_string(),
    }
}

/// What a named container was made from (`meta.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedMeta {
    /// The name.
    pub name: String,
    /// The owner's uid.
    pub uid: u32,
    /// Job or global.
    pub scope: Scope,
    /// `--container-image` as given when it was created.
    pub image: String,
    /// The image's manifest digest (`None` for a squashfs file given by path).
    pub manifest_digest: Option<String>,
    /// The squashfs file it was made from.
    pub squashfs: PathBuf,
    /// When it was created (seconds since the epoch).
    pub created: u64,
}

/// One named container on disk.
#[derive(Debug, Clone)]
pub struct NamedRoot {
    /// Its folder.
    pub dir: PathBuf,
    /// What it was made from.
    pub meta: NamedMeta,
}

impl NamedRoot {
    /// The folder holding `upper/` and `work/`, for [`crate::container::ContainerSpec::upper_dir`].
    pub fn overlay_dir(&self) -> &Path {
        &self.dir
    }

    /// Marks the container as in use until the returned file is closed.
    pub fn hold(&self) -> Result<File> {
        let path = self.dir.join("lock");
        let file = open_lock(&path)?;
        lock_shared(&file).with_context(|| format!("cannot lock {}", path.display()))?;
        if !self.dir.join("meta.json").is_file() {
            bail!(
                "named container '{}' was removed while this step started; run the step again",
                self.meta.name
            );
        }
        Ok(file)
    }

    /// Disk space used by its changes, in bytes.
    pub fn changes_size(&self) -> u64 {
        crate::fsutil::tree_size(&self.dir.join("upper"))
    }
}

/// The named containers of one node store.
#[derive(Debug, Clone)]
pub struct NamedRoots {
    base: PathBuf,
}

impl NamedRoots {
    /// The named containers kept below the store folder `store_root`.
    pub fn new(store_root: &Path) -> NamedRoots {
        NamedRoots {
            base: store_root.join(CONTAINERS_DIR),
        }
    }

    /// The containers folder.
    pub fn base(&self) -> &Path {
        &self.base
    }

    /// The folder of `key` (whether it exists or not).
    pub fn dir(&self, key: &NamedKey) -> PathBuf {
        self.base.join(key.relative_dir())
    }

    /// The container `key`, if it exists.
    pub fn load(&self, key: &NamedKey) -> Result<Option<NamedRoot>> {
        load_dir(&self.dir(key))
    }

    /// Creates the folder of a new container with its metadata and empty
    /// `upper/` and `work/`. Fails when it exists.
    pub fn create(&self, key: &NamedKey, meta: &NamedMeta) -> Result<NamedRoot> {
        let dir = self.dir(key);
        self.make_private_parents(key.uid, dir.parent().expect("a key has parents"))?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create named container folder {}", dir.display()))?;
        for sub in ["upper", "work"] {
            fs::DirBuilder::new()
                .mode(0o755)
                .create(dir.join(sub))
                .with_context(|| format!("cannot create {}", dir.join(sub).display()))?;
        }
        let bytes = serde_json::to_vec_pretty(meta).context("cannot encode meta.json")?;
        crate::fsutil::write_synced(&dir.join("meta.json"), &bytes)?;
        Ok(NamedRoot {
            dir,
            meta: meta.clone(),
        })
    }

    /// A fresh folder with `upper/` and `work/` for an unnamed step whose root
    /// is saved (`--container-save`), removed by the caller after the save
    /// (or with the job's folder at the job's end).
    pub fn save_scratch(&self, uid: u32, job: u32, step: u32) -> Result<PathBuf> {
        let parent = self
            .base
            .join(uid.to_string())
            .join(scope_dir(Scope::Job(job)));
        self.make_private_parents(uid, &parent)?;
        let dir = parent.join(format!(".save-{step}"));
        if dir.exists() {
            fs::remove_dir_all(&dir)
                .with_context(|| format!("cannot remove the old {}", dir.display()))?;
        }
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        for sub in ["upper", "work"] {
            fs::DirBuilder::new()
                .mode(0o755)
                .create(dir.join(sub))
                .with_context(|| format!("cannot create {}", dir.join(sub).display()))?;
        }
        Ok(dir)
    }

    /// Creates `<base>` (0755), `<base>/<uid>` and `parent` (0700, root's).
    fn make_private_parents(&self, uid: u32, parent: &Path) -> Result<()> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&self.base)
            .with_context(|| format!("cannot create {}", self.base.display()))?;
        let user_dir = self.base.join(uid.to_string());
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        for dir in [&user_dir, &parent.to_path_buf()] {
            let meta = fs::symlink_metadata(dir)
                .with_context(|| format!("cannot stat {}", dir.display()))?;
            if !meta.is_dir() || meta.uid() != 0 {
                bail!(
                    "{} is not a folder owned by root: remove it (named containers live there)",
                    dir.display()
                );
            }
            if meta.mode() & 0o077 != 0 {
                fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
                    .with_context(|| format!("cannot chmod {}", dir.display()))?;
            }
        }
        Ok(())
    }

    /// Every named container, of `uid` only when given, sorted by folder.
    pub fn list(&self, uid: Option<u32>) -> Result<Vec<NamedRoot>> {
        let mut found = Vec::new();
        for user_dir in sub_dirs(&self.base)? {
            let owner = user_dir.file_name().and_then(|n| n.to_str());
            if uid.is_some_and(|uid| owner != Some(uid.to_string().as_str())) {
                continue;
            }
            for scope_dir in sub_dirs(&user_dir)? {
                for dir in sub_dirs(&scope_dir)? {
                    if let Some(root) = load_dir(&dir)? {
                        found.push(root);
                    }
                }
            }
        }
        found.sort_by(|a, b| a.dir.cmp(&b.dir));
        Ok(found)
    }

    /// Removes a container, unless a step uses it (then the error says so).
    pub fn remove(&self, root: &NamedRoot) -> Result<()> {
        let lock_path = root.dir.join("lock");
        let lock = open_lock(&lock_path)?;
        if !try_lock_exclusive(&lock)
            .with_context(|| format!("cannot lock {}", lock_path.display()))?
        {
            bail!(
                "named container '{}' is in use by a running step; remove it after the step ends",
                root.meta.name
            );
        }
        remove_tree(&root.dir)
    }

    /// Removes every named container of job `job` (all users), with the
    /// scratch folders of its saved steps; returns the folders removed.
    pub fn remove_job(&self, job: u32) -> Result<Vec<PathBuf>> {
        let mut removed = Vec::new();
        for user_dir in sub_dirs(&self.base)? {
            let dir = user_dir.join(scope_dir(Scope::Job(job)));
            if dir.is_dir() {
                remove_tree(&dir)?;
                removed.push(dir);
            }
        }
        Ok(removed)
    }
}

/// Removes `dir` and everything below it: renamed aside first, so a half
/// removed folder never looks like a container.
fn remove_tree(dir: &Path) -> Result<()> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let aside = dir.with_file_name(format!(".removing-{name}-{}", std::process::id()));
    fs::rename(dir, &aside).with_context(|| format!("cannot rename {}", dir.display()))?;
    fs::remove_dir_all(&aside).with_context(|| format!("cannot remove {}", aside.display()))
}

fn load_dir(dir: &Path) -> Result<Option<NamedRoot>> {
    let path = dir.join("meta.json");
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let meta = serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "named container metadata {} is corrupt: remove {}",
            path.display(),
            dir.display()
        )
    })?;
    Ok(Some(NamedRoot {
        dir: dir.to_path_buf(),
        meta,
    }))
}

/// The sub-folders of `dir` (none when it does not exist), skipping names
/// that start with `.` (scratch and half-removed folders).
fn sub_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if !hidden && entry.file_type().is_ok_and(|t| t.is_dir()) {
            dirs.push(entry.path());
        }
    }
    dirs.sort();
    Ok(dirs)
}

fn open_lock(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot open lock file {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str, scope: Scope) -> NamedMeta {
        NamedMeta {
            name: name.into(),
            uid: 1000,
            scope,
            image: "busybox".into(),
            manifest_digest: Some("sha256:ab".into()),
            squashfs: "/s/image.sqfs".into(),
            created: 1,
        }
    }

    fn key(name: &str, scope: Scope) -> NamedKey {
        NamedKey {
            uid: 1000,
            scope,
            name: name.into(),
        }
    }

    #[test]
    fn create_load_list_remove() {
        let store = tempfile::tempdir().unwrap();
        let roots = NamedRoots::new(store.path());
        let job = key("a", Scope::Job(7));
        assert!(roots.load(&job).unwrap().is_none());
        let root = roots.create(&job, &meta("a", Scope::Job(7))).unwrap();
        assert_eq!(root.dir, store.path().join("containers/1000/job-7/a"));
        assert!(root.dir.join("upper").is_dir() && root.dir.join("work").is_dir());
        assert!(roots.create(&job, &meta("a", Scope::Job(7))).is_err());
        let global = key("a", Scope::Global);
        roots.create(&global, &meta("a", Scope::Global)).unwrap();
        assert_eq!(roots.load(&job).unwrap().unwrap().meta.scope, Scope::Job(7));
        assert_eq!(roots.list(Some(1000)).unwrap().len(), 2);
        assert_eq!(roots.list(Some(1001)).unwrap().len(), 0);
        let user_dir = store.path().join("containers/1000");
        assert_eq!(fs::metadata(&user_dir).unwrap().mode() & 0o777, 0o700);

        // In use: refused; then removed.
        let hold = root.hold().unwrap();
        let e = roots.remove(&root).unwrap_err();
        assert!(e.to_string().contains("in use"), "{e}");
        drop(hold);
        roots.remove(&root).unwrap();
        assert!(roots.load(&job).unwrap().is_none());

        roots.create(&job, &meta("a", Scope::Job(7))).unwrap();
        let scratch = roots.save_scratch(1000, 7, 3).unwrap();
        assert!(scratch.join("upper").is_dir());
        let removed = roots.remove_job(7).unwrap();
        assert_eq!(removed, vec![store.path().join("containers/1000/job-7")]);
        assert_eq!(roots.list(None).unwrap().len(), 1, "the global one stays");
    }

    #[test]
    fn labels_are_single_components() {
        assert_eq!(key("x", Scope::Job(5)).label(), "1000.job-5.x");
        assert_eq!(key("x", Scope::Global).label(), "1000.global.x");
        assert_eq!(key("x", Scope::Job(5)).describe(), "'x' (job 5)");
    }
}
