//! The container runtime: turns a squashfs image file into namespaces that
//! tasks join.
//!
//! A helper process, the *holder* ([`holder_main`], started by [`spawn_holder`]),
//! builds the container in stages and hands its user and mount namespaces to the
//! caller as descriptors ([`Container`]); each task then joins them
//! ([`Container::join`]) or the CLI runs a command in them ([`Container::run`]).
//!
//! What it owns: namespaces, the loop device, the root file system and its
//! mounts, `/etc/passwd` and `/etc/group` inside, the task environment.
//! What it must not touch: the image store (it only reads the squashfs file it
//! is given), the host's mount table (everything happens in private mount
//! namespaces), and any path outside the image root except bind sources.
//!
//! Modules, one job each: [`spec`] (what a container is, as data),
//! [`usermount`] (the `--container-mounts` grammar), [`mountplan`] (which
//! mounts, in which order), [`env`](mod@env) (task environment),
//! [`entrypoint`] (the command with the image ENTRYPOINT), [`etcfiles`]
//! (passwd and group), [`safepath`] (path operations a hostile image cannot
//! escape), [`loopdev`] (loop devices), [`mounts`] (mount operations), `fuse`
//! (daemons of unprivileged mode), `netns` (loopback up in a new network
//! namespace), `ipcns` (own `/dev/shm` and `/dev/mqueue` in a new IPC
//! namespace), [`jobns`] (the job's namespace of `job_container/tmpfs`), `seccomp` (the remap-root filter),
//! [`taskhooks`] (the PMIx and PyTorch variables of enroot's hooks),
//! [`fstab`] (enroot's fstab lines), [`sitehooks`] (a site's enroot hooks,
//! run as the user before the tasks start),
//! [`save`] (`--container-save`: pack a root into a squashfs file),
//! [`channel`] (messages to and from the holder), [`holder`] (the stages),
//! `spawn` (the caller's side) and `join` (the [`Container`]).

pub mod channel;
pub mod entrypoint;
pub mod env;
pub mod etcfiles;
pub mod fstab;
mod fuse;
pub mod holder;
pub mod idmap;
mod ipcns;
pub mod jobns;
mod join;
pub mod loopdev;
pub mod mountplan;
pub mod mounts;
mod netns;
pub use crate::safepath;
pub mod injection;
pub mod save;
mod seccomp;
pub mod sitehooks;
mod spawn;
pub mod spec;
pub mod taskhooks;
pub mod usermount;

pub use env::task_env;
pub use holder::{holder_main, HOLDER_ARG};
pub use join::{enter_main, Container, ENTER_ARG};
pub use spawn::spawn_holder;
pub use spec::{
    parse_mounts, ContainerSpec, Mode, MountSpec, MountSpecError, Namespace, UserIdentity,
    UserMount,
};
