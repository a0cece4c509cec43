//! Site configuration (placeholder).
