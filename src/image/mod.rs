//! Image content: image configuration, layers flattened into one squashfs file.

pub mod config;

pub use config::ImageConfig;
