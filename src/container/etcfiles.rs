//! `/etc/passwd` and `/etc/group` for the container, so that `id` and `whoami`
//! name the user and the user's groups.
//!
//! The image's own entries are kept, except those that clash with the user:
//! an entry with the user's name or id but not both is replaced by the host's
//! entry (no name and no id appears twice); an entry with both is kept as is.

use crate::container::spec::UserIdentity;

/// `/etc/passwd` content: the image's file (may be empty) plus the user.
pub fn passwd_content(image_passwd: &str, user: &UserIdentity) -> String {
    let uid = user.uid.to_string();
    let mut has_user = false;
    let mut out = String::with_capacity(image_passwd.len() + 128);
    for line in image_passwd.lines() {
        match entry_name_and_id(line) {
            Some((name, id)) if name == user.name && id == uid => {
                has_user = true;
                push_line(&mut out, line);
            }
            Some((name, id)) if name == user.name || id == uid => {}
            _ => push_line(&mut out, line),
        }
    }
    if !has_user {
        let line = format!(
            "{}:x:{}:{}::{}:{}",
            user.name, user.uid, user.gid, user.home, user.shell
        );
        push_line(&mut out, &line);
    }
    out
}

/// `/etc/group` content: the image's file (may be empty) plus every group of
/// the user that the host can name, with the user listed as a member of its
/// supplementary groups.
pub fn group_content(image_group: &str, user: &UserIdentity) -> String {
    let wanted: Vec<(String, String, bool)> = user
        .all_gids()
        .into_iter()
        .filter_map(|gid| {
            let name = user.group_names.get(&gid)?;
            Some((name.clone(), gid.to_string(), gid != user.gid))
        })
        .collect();
    let mut present = vec![false; wanted.len()];
    let mut out = String::with_capacity(image_group.len() + 128);
    for line in image_group.lines() {
        let Some((name, id)) = entry_name_and_id(line) else {
            push_line(&mut out, line);
            continue;
        };
        let exact = wanted.iter().position(|(n, g, _)| n == name && g == id);
        let clash = wanted.iter().any(|(n, g, _)| n == name || g == id);
        match exact {
            Some(index) => {
                present[index] = true;
                let is_member_group = wanted[index].2;
                if is_member_group {
                    push_line(&mut out, &with_member(line, &user.name));
                } else {
                    push_line(&mut out, line);
                }
            }
            None if clash => {}
            None => push_line(&mut out, line),
        }
    }
    for ((name, gid, is_member_group), present) in wanted.iter().zip(present) {
        if !present {
            let members = if *is_member_group {
                user.name.as_str()
            } else {
                ""
            };
            push_line(&mut out, &format!("{name}:x:{gid}:{members}"));
        }
    }
    out
}

/// The name (field 1) and numeric id (field 3) of a passwd or group line.
fn entry_name_and_id(line: &str) -> Option<(&str, &str)> {
    if line.starts_with('#') {
        return None;
    }
    let mut fields = line.split(':');
    let name = fields.next()?;
    let _password = fields.next()?;
    let id = fields.next()?;
    if name.is_empty() || id.is_empty() {
        return None;
    }
    Some((name, id))
}

/// A group line with `member` added to its member list (field 4) if missing.
fn with_member(line: &str, member: &str) -> String {
    let fields: Vec<&str> = line.splitn(4, ':').collect();
    let members = fields.get(3).copied().unwrap_or("");
    if members.split(',').any(|m| m == member) {
        return line.to_string();
    }
    let members = if members.is_empty() {
        member.to_string()
    } else {
        format!("{members},{member}")
    };
    format!("{}:{}:{}:{members}", fields[0], fields[1], fields[2])
}

fn push_line(out: &mut String, line: &str) {
    out.push_str(line);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn alice() -> UserIdentity {
        UserIdentity {
            uid: 1001,
            gid: 1002,
            groups: vec![1002, 1001, 27],
            name: "alice".into(),
            home: "/home/alice".into(),
            shell: "/bin/bash".into(),
            group_names: BTreeMap::from([
                (1002, "alice".to_string()),
                (1001, "physics".to_string()),
                (27, "sudo".to_string()),
            ]),
        }
    }

    const IMAGE_PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
                                daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
                                ubuntu:x:1001:1001:Ubuntu:/home/ubuntu:/bin/bash\n";

    #[test]
    fn passwd_appends_user_to_empty_image() {
        assert_eq!(
            passwd_content("", &alice()),
            "alice:x:1001:1002::/home/alice:/bin/bash\n"
        );
    }

    #[test]
    fn passwd_replaces_entry_with_same_uid() {
        assert_eq!(
            passwd_content(IMAGE_PASSWD, &alice()),
            "root:x:0:0:root:/root:/bin/sh\n\
             daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
             alice:x:1001:1002::/home/alice:/bin/bash\n"
        );
    }

    #[test]
    fn passwd_replaces_entry_with_same_name() {
        let image = "root:x:0:0:root:/root:/bin/sh\nalice:x:2000:2000::/home/alice:/bin/sh";
        assert_eq!(
            passwd_content(image, &alice()),
            "root:x:0:0:root:/root:/bin/sh\nalice:x:1001:1002::/home/alice:/bin/bash\n"
        );
    }

    #[test]
    fn passwd_keeps_exact_entry_and_comments() {
        let image = "# comment\nroot:x:0:0:root:/root:/bin/sh\nalice:x:1001:1002:A:/h:/bin/sh\n";
        assert_eq!(passwd_content(image, &alice()), image);
    }

    #[test]
    fn passwd_for_root_keeps_image_root() {
        let root = UserIdentity {
            uid: 0,
            gid: 0,
            groups: vec![0],
            name: "root".into(),
            home: "/root".into(),
            shell: "/bin/bash".into(),
            group_names: BTreeMap::from([(0, "root".to_string())]),
        };
        assert_eq!(passwd_content(IMAGE_PASSWD, &root), IMAGE_PASSWD);
        assert_eq!(group_content("root:x:0:\n", &root), "root:x:0:\n");
    }

    #[test]
    fn group_adds_missing_groups_and_membership() {
        let image = "root:x:0:\nsudo:x:27:ubuntu\nubuntu:x:1001:\n";
        assert_eq!(
            group_content(image, &alice()),
            "root:x:0:\n\
             sudo:x:27:ubuntu,alice\n\
             alice:x:1002:\n\
             physics:x:1001:alice\n"
        );
    }

    #[test]
    fn group_does_not_duplicate_member() {
        let image = "sudo:x:27:alice\n";
        let out = group_content(image, &alice());
        assert!(out.starts_with("sudo:x:27:alice\n"), "{out}");
    }

    #[test]
    fn group_skips_unnamed_groups() {
        let mut user = alice();
        user.group_names.remove(&27);
        let out = group_content("", &user);
        assert_eq!(out, "alice:x:1002:\nphysics:x:1001:alice\n");
    }

    #[test]
    fn group_drops_entry_with_clashing_name() {
        let image = "physics:x:500:\n";
        assert_eq!(
            group_content(image, &alice()),
            "alice:x:1002:\nphysics:x:1001:alice\nsudo:x:27:alice\n"
        );
    }
}
