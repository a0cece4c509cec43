//! The hidden helpers the plugin runs, and how they are run.
//!
//! - [`protocol`]: the pull helper's request (one JSON line on stdin, the
//!   user's credentials after it on the same pipe, never in argv) and its
//!   reply (one JSON line on stdout: the stored image, "not in store", or an
//!   error with a kind and a message); progress goes to stderr.
//! - [`import`]: the import helper's request (a user's squashfs file, as an
//!   inherited descriptor, re-packed into the store as the pull user).
//! - [`runner`]: the one function that starts a helper as the job's user,
//!   the pull user or full root, and waits for it (limit, interrupts, output
//!   caps, progress lines forwarded to the user).
//!
//! The helper's side of a pull (`berth __pull`) is `crate::puller::serve`.

pub mod import;
pub mod protocol;
pub mod runner;

pub use import::{ImportJob, IMPORT_ARG};
pub use protocol::{ErrorKind, HelperError, PullJob, PullReply, PullSettings, PULL_ARG};
pub use runner::{run, Finished, Options, RunAs};
