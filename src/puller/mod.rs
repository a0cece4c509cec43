//! The image pull as an unprivileged process: the only step that parses
//! network bytes runs as the dedicated pull user (`pull_user`), never as
//! root, with the requesting user's own registry credentials.
//!
//! [`pull`] is the one entry point (the SPANK plugin and root's CLI both
//! call it):
//!
//! 1. as root, the node store is prepared for the pull user ([`layout`]);
//! 2. the requesting user's credentials for the image's registry are looked
//!    up by `berth __credentials` running as that user ([`CredentialsFrom`]);
//! 3. `berth __pull` runs as the pull user (no groups, `no_new_privs`,
//!    cleared environment; it makes itself non-dumpable) and reads the
//!    request, with every setting of the pull, and then the credentials from
//!    its stdin ([`crate::helper::protocol`]); it reads no config file;
//! 4. its one reply line is the stored image, or an error.
//!
//! [`import_file`] is the other entry point: a squashfs file a user gave,
//! re-packed into the store by `berth __import` as the pull user;
//! [`import_daemon`] feeds the same helper what a local container engine
//! saves, asked as the job's user ([`daemon`]).

pub mod creds;
pub mod daemon;
pub mod identity;
pub mod import;
mod import_cache;
pub mod layout;
mod run;
pub mod serve;

pub use creds::{hosts_for, CredentialSet};
pub use daemon::import_daemon;
pub use identity::PullUser;
pub use import::{import_file, ImportRequest};
pub use layout::{check_reachable, content_owner, prepare_store, CONTENT_DIRS, ROOT_MODE};
pub use run::{pull, Answer, CredentialsFrom, PullRequest, Pulled, Requester, CREDENTIALS_ARG};
