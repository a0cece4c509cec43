//! SPANK plugin (placeholder).
