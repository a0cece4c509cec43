//! The current layer's hidden regular files, kept in memory (bounded) for
//! the hard links that still want their content.
//!
//! A file an upper layer replaced or deleted is not written at its path; a
//! hard link to it (of the same layer, later in its tar, or of an upper
//! layer, read before it) still gets its old content. Without a copy at
//! hand that content is only to be had by reading the layer again at the
//! end; kept here, the link is written as soon as the link and its target
//! have both been read. Only small files are kept, the oldest dropped first
//! past the budget; a link to one dropped falls back to the reread.

use std::collections::{HashMap, VecDeque};

use tar::{EntryType, Header};

use super::paths::PathId;

/// Most bytes of content kept for one layer.
const BUDGET: usize = 16 << 20;
/// Largest file kept.
const FILE_MAX: u64 = 1 << 20;

/// A hidden file's entry: header, PAX records and content.
pub(super) struct HiddenFile {
    pub header: Header,
    pub pax: Vec<(String, Vec<u8>)>,
    pub data: Vec<u8>,
}

/// The kept files of the layer being read, by tar ordinal, and where the
/// content of each was first written for a link.
#[derive(Default)]
pub(super) struct HiddenFiles {
    kept: HashMap<u32, HiddenFile>,
    order: VecDeque<u32>,
    bytes: usize,
    written_at: HashMap<u32, PathId>,
}

impl HiddenFiles {
    /// Whether an entry of `header`'s type and size is worth keeping.
    pub(super) fn wants(header: &Header, size: u64) -> bool {
        matches!(
            header.entry_type(),
            EntryType::Regular | EntryType::Continuous
        ) && size <= FILE_MAX
    }

    /// Keeps entry `ordinal`, dropping the oldest past the budget.
    pub(super) fn keep(&mut self, ordinal: u32, file: HiddenFile) {
        self.bytes += file.data.len();
        self.kept.insert(ordinal, file);
        self.order.push_back(ordinal);
        while self.bytes > BUDGET {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(gone) = self.kept.remove(&oldest) {
                self.bytes -= gone.data.len();
            }
        }
    }

    /// The kept entry `ordinal`.
    pub(super) fn get(&self, ordinal: u32) -> Option<&HiddenFile> {
        self.kept.get(&ordinal)
    }

    /// Where entry `ordinal`'s content was written for a link, if it was.
    pub(super) fn written_at(&self, ordinal: u32) -> Option<PathId> {
        self.written_at.get(&ordinal).copied()
    }

    /// Records that entry `ordinal`'s content is now at `path`.
    pub(super) fn set_written_at(&mut self, ordinal: u32, path: PathId) {
        self.written_at.insert(ordinal, path);
    }

    /// Forgets the layer's files (ordinals are per layer).
    pub(super) fn clear(&mut self) {
        *self = HiddenFiles::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(len: usize) -> HiddenFile {
        HiddenFile {
            header: Header::new_gnu(),
            pax: Vec::new(),
            data: vec![7; len],
        }
    }

    #[test]
    fn the_oldest_files_go_past_the_budget() {
        let mut files = HiddenFiles::default();
        let each = (FILE_MAX as usize) / 2;
        let fit = BUDGET / each;
        for ordinal in 0..fit as u32 + 2 {
            files.keep(ordinal, file(each));
        }
        assert!(files.get(0).is_none() && files.get(1).is_none());
        assert!(files.get(2).is_some() && files.get(fit as u32 + 1).is_some());
        assert!(files.bytes <= BUDGET);
        files.set_written_at(5, 9);
        assert_eq!(files.written_at(5), Some(9));
        files.clear();
        assert!(files.get(fit as u32).is_none() && files.written_at(5).is_none());
    }

    #[test]
    fn only_small_regular_files_are_wanted() {
        let mut header = Header::new_gnu();
        header.set_entry_type(EntryType::Regular);
        assert!(HiddenFiles::wants(&header, FILE_MAX));
        assert!(!HiddenFiles::wants(&header, FILE_MAX + 1));
        header.set_entry_type(EntryType::GNUSparse);
        assert!(!HiddenFiles::wants(&header, 10));
        header.set_entry_type(EntryType::Symlink);
        assert!(!HiddenFiles::wants(&header, 0));
    }
}
