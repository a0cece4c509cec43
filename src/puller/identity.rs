//! The unprivileged system user the image pull runs as (`pull_user`).

use anyhow::anyhow;
use nix::unistd::User;

/// The command that creates the pull user, for error messages and docs.
pub fn create_command(name: &str) -> String {
    format!(
        "useradd --system --user-group --no-create-home --home-dir /nonexistent \
         --shell /usr/sbin/nologin --comment 'berth image puller' {name}"
    )
}

/// The pull user, resolved on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullUser {
    /// Login name (`pull_user`).
    pub name: String,
    /// Its uid; never 0.
    pub uid: u32,
    /// Its primary gid; never 0.
    pub gid: u32,
}

impl PullUser {
    /// Looks `name` up in this node's user database. A missing user, or one
    /// with uid or gid 0, is an error naming the `pull_user` key and the
    /// command that creates the user.
    pub fn lookup(name: &str) -> anyhow::Result<PullUser> {
        let user = User::from_name(name)
            .map_err(|e| anyhow!("cannot look up the pull user `{name}` (pull_user): {e:#}"))?;
        let Some(user) = user else {
            return Err(anyhow!(
                "the pull user `{name}` (plugstack pull_user, default berth) does not exist on \
                 this node; berth pulls images as that unprivileged system user, never as root: \
                 ask the administrator to create it (`{}`) or to set pull_user to an existing \
                 system user",
                create_command(name)
            ));
        };
        if user.uid.is_root() || user.gid.as_raw() == 0 {
            return Err(anyhow!(
                "the pull user `{name}` (pull_user) has uid {} and gid {}: it must be an \
                 unprivileged system user, not root or root's group; create one with `{}`",
                user.uid,
                user.gid,
                create_command("berth")
            ));
        }
        Ok(PullUser {
            name: name.to_string(),
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
        })
    }

    /// The pull user as a file-system identity (no supplementary groups, as
    /// the puller runs): root opens the store's images with it, so only what
    /// the pull user itself could read is ever mounted.
    pub fn identity(&self) -> crate::container::spec::UserIdentity {
        crate::container::spec::UserIdentity {
            uid: self.uid,
            gid: self.gid,
            groups: vec![self.gid],
            name: self.name.clone(),
            home: "/".to_string(),
            shell: "/bin/sh".to_string(),
            group_names: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_root_users_are_refused_with_the_fix() {
        let e = PullUser::lookup("no-such-berth-user")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("pull_user") && e.contains("useradd --system") && e.contains("does not"),
            "{e:#}"
        );
        let e = PullUser::lookup("root").unwrap_err().to_string();
        assert!(e.contains("unprivileged"), "{e:#}");
        let nobody = PullUser::lookup("nobody").unwrap();
        assert_ne!(nobody.uid, 0);
    }
}
