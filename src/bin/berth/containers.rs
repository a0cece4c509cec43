//! `berth containers list|rm`: the named containers kept on this node.

use std::process::ExitCode;

use anyhow::{bail, Context, Result};

use berth::named::{check_name, NamedKey, NamedRoots, Scope};
use berth::units::format_size;

use crate::store_args::StoreDir;

/// What `berth containers` does.
#[derive(clap::Subcommand)]
pub enum Action {
    /// List named containers: owner, scope, name, image, size of their changes.
    #[command(alias = "ls")]
    List {
        /// Only this user's (name or uid).
        #[arg(long)]
        user: Option<String>,
        #[command(flatten)]
        store: StoreDir,
    },
    /// Remove named containers (not while a step uses them).
    #[command(alias = "remove")]
    Rm {
        /// Container names.
        #[arg(required = true)]
        names: Vec<String>,
        /// Whose containers (name or uid; default: root's own).
        #[arg(long)]
        user: Option<String>,
        /// Containers of this job (scope `job`); without it, global ones.
        #[arg(long)]
        job: Option<u32>,
        #[command(flatten)]
        store: StoreDir,
    },
}

/// `berth containers list|rm` (root only: the containers live in the node
/// store; users have `srun --container-list` and `--container-remove`).
pub fn run(action: Action) -> Result<ExitCode> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "named containers live in the node store, which belongs to root: to list or remove \
             your own, run `srun --container-list true` or `srun --container-remove=NAME true` \
             (add -N/-w for the nodes); `berth containers` is for root"
        );
    }
    match action {
        Action::List { user, store } => list(user.as_deref(), &store),
        Action::Rm {
            names,
            user,
            job,
            store,
        } => remove(names, user.as_deref(), job, &store),
    }
}

/// `berth containers list`: one line per named container.
fn list(user: Option<&str>, store: &StoreDir) -> Result<ExitCode> {
    let uid = user.map(uid_of).transpose()?;
    let roots = NamedRoots::new(&store.root()?);
    let list = roots.list(uid)?;
    say!(
        "{:<10} {:<12} {:<24} {:>9}  IMAGE",
        "USER",
        "SCOPE",
        "NAME",
        "CHANGES"
    );
    for root in list {
        let meta = &root.meta;
        let owner = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(meta.uid))
            .ok()
            .flatten()
            .map_or_else(|| meta.uid.to_string(), |u| u.name);
        let scope = match meta.scope {
            Scope::Job(job) => format!("job {job}"),
            Scope::Global => "global".to_string(),
        };
        say!(
            "{owner:<10} {scope:<12} {:<24} {:>9}  {}",
            meta.name,
            format_size(root.changes_size()),
            meta.image
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth containers rm`: removes each; reports every failure and exits 1
/// if there was one.
fn remove(
    names: Vec<String>,
    user: Option<&str>,
    job: Option<u32>,
    store: &StoreDir,
) -> Result<ExitCode> {
    let uid = user.map(uid_of).transpose()?.unwrap_or(0);
    let roots = NamedRoots::new(&store.root()?);
    let mut failed = false;
    for name in names {
        check_name(&name).map_err(anyhow::Error::msg)?;
        let key = NamedKey {
            uid,
            scope: job.map_or(Scope::Global, Scope::Job),
            name,
        };
        let result = match roots.load(&key)? {
            Some(root) => roots.remove(&root),
            None => Err(anyhow::anyhow!(
                "no named container {} of uid {uid} in {}",
                key.describe(),
                roots.base().display()
            )),
        };
        match result {
            Ok(()) => say!("removed {}", key.describe()),
            Err(e) => {
                eprintln!("error: {e:#}");
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// A user name or uid, as a uid.
fn uid_of(user: &str) -> Result<u32> {
    if let Ok(uid) = user.parse() {
        return Ok(uid);
    }
    nix::unistd::User::from_name(user)
        .with_context(|| format!("cannot look up user '{user}'"))?
        .map(|u| u.uid.as_raw())
        .with_context(|| format!("no user named '{user}' on this node"))
}
