//! Image content: the image configuration (also as a squashfs file carries
//! it in its root: [`carried`]), and layers flattened into one squashfs file.
//!
//! Owns: reading layer tars (never onto the host file system), whiteouts and
//! hard links, writing the squashfs file (berth's own streaming writer, or
//! tar2sqfs). Must not talk to registries or know the
//! store's layout: callers hand in [`Layer`]s and a destination path.

pub mod carried;
mod chunks;
pub mod config;
pub mod flatten;
pub mod layer;
pub mod shellwords;
pub mod sqfs;
pub mod squashfs;
pub mod writeback;

pub use config::ImageConfig;
pub use layer::Layer;
pub use squashfs::{
    convert, convert_with, ConvertStats, SquashfsOptions, SquashfsWriter, DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_ZSTD_LEVEL,
};

/// Version of the layers-to-squashfs conversion. Stored images made by another
/// version are converted again: bump it whenever the output changes.
pub const CONVERTER_VERSION: u32 = 2;
