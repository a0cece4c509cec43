//! Named containers (`--container-name`): a container whose root file system
//! changes outlive the step, reused or joined by later steps.
//!
//! - [`name`]: the `NAME[:FLAG]` value and its flags;
//! - [`roots`]: the containers' folders on node-local storage (overlay upper
//!   and work folders, what each was made from);
//! - [`running`]: which steps run a container now, and how to join one;
//! - [`trust`]: the ownership checks on `runtime_path` before a record is believed;
//! - [`decide`]: what a step does, from the flag and what exists.
//!
//! It owns nothing of the runtime: containers are built by
//! [`crate::container`] with [`crate::container::ContainerSpec::upper_dir`]
//! pointing at a folder of [`roots`].

pub mod name;
pub mod roots;
pub mod running;
pub mod trust;

pub use name::{check_name, ContainerName, NameFlag};
pub use roots::{NamedKey, NamedMeta, NamedRoot, NamedRoots, Scope};
pub use running::{HeldElsewhere, Registry, RunningStep};

/// What a step does with a named container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Join the container a running step holds (the first record).
    Join,
    /// A new container on the existing root (its changes kept).
    Reuse,
    /// A new container and a new root, from `--container-image`.
    Create,
}

/// Decides what a step with `flag` does, given whether the container exists,
/// whether a step runs it, and whether `--container-image` was given. The
/// error says what was wrong and what to do.
pub fn decide(
    name: &ContainerName,
    exists: bool,
    running: bool,
    image_given: bool,
) -> Result<Action, String> {
    let label = &name.name;
    match name.flag {
        NameFlag::Create if exists => Err(format!(
            "--container-name={label}:create: a container named '{label}' already exists; \
             use --container-name={label} to reuse it, or another name"
        )),
        NameFlag::Exec if !running => Err(format!(
            "--container-name={label}:exec: no step on this node runs container '{label}'{}; \
             start it first, or use --container-name={label} to start it here",
            if exists { "" } else { " (it does not exist)" }
        )),
        NameFlag::NoExec if running => Err(format!(
            "--container-name={label}:no_exec: container '{label}' is still running in another \
             step after a minute's wait, and berth never mounts a root file system twice (its \
             changes live in one overlay); join it with --container-name={label}:exec, or start \
             this step when that one has ended"
        )),
        NameFlag::Auto | NameFlag::Exec if running => Ok(Action::Join),
        _ if exists => Ok(Action::Reuse),
        _ if image_given => Ok(Action::Create),
        _ => Err(format!(
            "--container-name={label}: no container named '{label}' exists on this node, and \
             --container-image is not given to create it; add --container-image=IMAGE"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(value: &str, exists: bool, running: bool, image: bool) -> Result<Action, String> {
        decide(
            &ContainerName::parse(value).unwrap(),
            exists,
            running,
            image,
        )
    }

    #[test]
    fn auto_joins_reuses_or_creates() {
        assert_eq!(run("n", true, true, false), Ok(Action::Join));
        assert_eq!(run("n", true, false, true), Ok(Action::Reuse));
        assert_eq!(run("n", false, false, true), Ok(Action::Create));
        let e = run("n", false, false, false).unwrap_err();
        assert!(e.contains("--container-image is not given"), "{e}");
    }

    #[test]
    fn create_refuses_an_existing_name() {
        assert_eq!(run("n:create", false, false, true), Ok(Action::Create));
        let e = run("n:create", true, false, true).unwrap_err();
        assert!(e.contains("already exists"), "{e}");
    }

    #[test]
    fn exec_needs_a_running_step() {
        assert_eq!(run("n:exec", true, true, false), Ok(Action::Join));
        let e = run("n:exec", true, false, true).unwrap_err();
        assert!(e.contains("no step on this node runs"), "{e}");
        let e = run("n:exec", false, false, true).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn no_exec_never_joins() {
        assert_eq!(run("n:no_exec", true, false, false), Ok(Action::Reuse));
        assert_eq!(run("n:no_exec", false, false, true), Ok(Action::Create));
        let e = run("n:no_exec", true, true, true).unwrap_err();
        assert!(e.contains(":exec"), "{e}");
    }
}
