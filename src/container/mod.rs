//! (placeholder: filled in by the container work)
