//! The submitting user's bearer tokens, kept between their `srun`s.
//!
//! Each `srun`, `sbatch` or `salloc` by tag asks the registry which digest
//! the tag names. Behind a token service (Docker Hub, nvcr.io, Harbor) that
//! costs a challenge and a token exchange on top of the request: two more
//! connections and round trips. Tokens live for minutes, so the user's own
//! submissions keep them in a file of the user's, and reuse them until they
//! expire: `$XDG_RUNTIME_DIR/berth/registry-tokens.json` when the user has a
//! runtime folder (a tmpfs of their own), else
//! `$HOME/.cache/berth/registry-tokens.json`. Only bearer tokens are kept
//! (never a password or a basic header); the folder is the user's, mode
//! 0700, the file mode 0600, replaced whole by a rename. A file or folder
//! that is not the user's alone is not read, and nothing is written there.
//! A token the registry refuses is dropped and a new one asked for.

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The largest token file read.
const MAX_BYTES: u64 = 1 << 20;

/// The file's name in its folder.
const FILE_NAME: &str = "registry-tokens.json";

/// One kept token: the `Authorization` value and when it expires (seconds
/// since the epoch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptToken {
    /// `Bearer ...`.
    pub header: String,
    /// Expiry, seconds since the epoch.
    pub expires: u64,
}

/// The user's token file.
#[derive(Debug, Clone)]
pub struct TokenFile {
    path: PathBuf,
}

/// Seconds since the epoch now.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether `meta` is the calling user's and no one else may write it (nor
/// read it, for a file).
fn own_only(meta: &fs::Metadata, private: bool) -> bool {
    let mask = if private { 0o077 } else { 0o022 };
    meta.uid() == nix::unistd::geteuid().as_raw() && meta.mode() & mask == 0
}

impl TokenFile {
    /// The file in `dir` (made, mode 0700, when missing).
    pub fn in_dir(dir: &Path) -> TokenFile {
        TokenFile {
            path: dir.join(FILE_NAME),
        }
    }

    /// The calling user's file: in their runtime folder
    /// (`XDG_RUNTIME_DIR`) when it is theirs, else under `$HOME/.cache`;
    /// `None` when neither is known.
    pub fn for_current_user() -> Option<TokenFile> {
        let runtime = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|dir| {
                dir.is_absolute()
                    && fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && own_only(&m, true))
            });
        if let Some(runtime) = runtime {
            return Some(TokenFile::in_dir(&runtime.join("berth")));
        }
        let home = PathBuf::from(std::env::var_os("HOME")?);
        home.is_absolute()
            .then(|| TokenFile::in_dir(&home.join(".cache").join("berth")))
    }

    /// Where the tokens are kept.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The unexpired tokens by key; none when the file is missing, not the
    /// user's alone, too large or unreadable.
    pub fn load(&self) -> HashMap<String, KeptToken> {
        let Some(dir) = self.path.parent() else {
            return HashMap::new();
        };
        if !fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && own_only(&m, false)) {
            return HashMap::new();
        }
        let Ok(file) = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&self.path)
        else {
            return HashMap::new();
        };
        let usable = file
            .metadata()
            .is_ok_and(|m| m.is_file() && own_only(&m, true) && m.len() <= MAX_BYTES);
        let mut bytes = Vec::new();
        if !usable || file.take(MAX_BYTES).read_to_end(&mut bytes).is_err() {
            return HashMap::new();
        }
        let now = now_secs();
        serde_json::from_slice::<HashMap<String, KeptToken>>(&bytes)
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, t)| t.expires > now && t.header.starts_with("Bearer "))
            .collect()
    }

    /// Replaces the file with `tokens` (the unexpired bearer ones). Best
    /// effort: a folder that is not the user's alone is left alone.
    pub fn save(&self, tokens: &HashMap<String, KeptToken>) {
        let _ = self.try_save(tokens);
    }

    fn try_save(&self, tokens: &HashMap<String, KeptToken>) -> std::io::Result<()> {
        let dir = self.path.parent().ok_or(std::io::ErrorKind::InvalidInput)?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        if !fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && own_only(&m, false)) {
            return Err(std::io::ErrorKind::PermissionDenied.into());
        }
        let now = now_secs();
        let kept: HashMap<&String, &KeptToken> = tokens
            .iter()
            .filter(|(_, t)| t.expires > now && t.header.starts_with("Bearer "))
            .collect();
        let bytes = serde_json::to_vec(&kept).map_err(std::io::Error::other)?;
        let temp = dir.join(format!(".{FILE_NAME}.{}", std::process::id()));
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temp)?;
        let written = file
            .write_all(&bytes)
            .and_then(|()| fs::rename(&temp, &self.path));
        if written.is_err() {
            let _ = fs::remove_file(&temp);
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn token(header: &str, expires: u64) -> KeptToken {
        KeptToken {
            header: header.to_string(),
            expires,
        }
    }

    #[test]
    fn unexpired_bearer_tokens_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let file = TokenFile::in_dir(&dir.path().join("berth"));
        let later = now_secs() + 300;
        let tokens = HashMap::from([
            ("reg/a".to_string(), token("Bearer A", later)),
            ("reg/old".to_string(), token("Bearer O", now_secs() - 1)),
            ("reg/basic".to_string(), token("Basic dTpw", later)),
        ]);
        file.save(&tokens);
        let mode = fs::metadata(file.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            file.load(),
            HashMap::from([("reg/a".to_string(), token("Bearer A", later))])
        );
    }

    #[test]
    fn a_file_others_may_read_or_write_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let file = TokenFile::in_dir(&dir.path().join("berth"));
        let later = now_secs() + 300;
        file.save(&HashMap::from([(
            "reg/a".to_string(),
            token("Bearer A", later),
        )]));
        fs::set_permissions(file.path(), fs::Permissions::from_mode(0o644)).unwrap();
        assert!(file.load().is_empty(), "a world-readable file");
        fs::set_permissions(file.path(), fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(file.load().len(), 1);
        let folder = file.path().parent().unwrap();
        fs::set_permissions(folder, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(file.load().is_empty(), "a folder others may write");
        fs::set_permissions(folder, fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(file.path(), b"not json").unwrap();
        assert!(file.load().is_empty());
    }
}
