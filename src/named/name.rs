//! `--container-name=NAME[:FLAG]`: the name and what to do with it.

use std::fmt;

/// The longest name accepted (it becomes a folder name on the node).
pub const MAX_NAME_LEN: usize = 128;

/// What `--container-name`'s flag asks for (pyxis semantics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameFlag {
    /// Join the container if a step runs it, else reuse its root, else
    /// create it (the default).
    Auto,
    /// Create the container; an error if it exists.
    Create,
    /// Join the running container; an error if no step runs it.
    Exec,
    /// Never join: a new container on the existing root (or a new one).
    NoExec,
}

impl NameFlag {
    /// The flag as written after the `:`.
    pub fn as_str(self) -> &'static str {
        match self {
            NameFlag::Auto => "auto",
            NameFlag::Create => "create",
            NameFlag::Exec => "exec",
            NameFlag::NoExec => "no_exec",
        }
    }
}

/// A parsed `--container-name` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerName {
    /// The name: letters, digits, `_`, `-` and `.`, not starting with `.` or `-`.
    pub name: String,
    /// What to do with it.
    pub flag: NameFlag,
}

impl fmt::Display for ContainerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.flag.as_str())
    }
}

impl ContainerName {
    /// Parses `NAME[:FLAG]`; FLAG is `auto` (the default, also when empty),
    /// `create`, `exec` or `no_exec`. The error says what is wrong.
    pub fn parse(value: &str) -> Result<ContainerName, String> {
        let (name, flag) = match value.split_once(':') {
            Some((name, flag)) => (name, flag),
            None => (value, ""),
        };
        let flag = match flag {
            "" | "auto" => NameFlag::Auto,
            "create" => NameFlag::Create,
            "exec" => NameFlag::Exec,
            "no_exec" => NameFlag::NoExec,
            other => {
                return Err(format!(
                    "unknown flag '{other}' after the name (use NAME, NAME:auto, NAME:create, \
                     NAME:exec or NAME:no_exec)"
                ))
            }
        };
        check_name(name)?;
        Ok(ContainerName {
            name: name.to_string(),
            flag,
        })
    }
}

/// Checks a bare container name (also what `berth containers rm` takes).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the container name is empty (write --container-name=NAME)".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "the container name is {} characters long; at most {MAX_NAME_LEN} are allowed",
            name.len()
        ));
    }
    if name.starts_with(['.', '-']) {
        return Err(format!(
            "container name '{name}' starts with '{}'; start it with a letter, digit or _",
            &name[..1]
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "container name '{name}' contains {bad:?}; use letters, digits, '_', '-' and '.'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(value: &str) -> (String, NameFlag) {
        let name = ContainerName::parse(value).unwrap();
        (name.name, name.flag)
    }

    #[test]
    fn flags_default_to_auto() {
        assert_eq!(parsed("x"), ("x".into(), NameFlag::Auto));
        assert_eq!(parsed("x:"), ("x".into(), NameFlag::Auto));
        assert_eq!(parsed("x:auto"), ("x".into(), NameFlag::Auto));
        assert_eq!(
            parsed("my-env.2:create"),
            ("my-env.2".into(), NameFlag::Create)
        );
        assert_eq!(parsed("a_b:exec"), ("a_b".into(), NameFlag::Exec));
        assert_eq!(parsed("a:no_exec"), ("a".into(), NameFlag::NoExec));
    }

    #[test]
    fn bad_flags_and_names_are_explained() {
        let e = ContainerName::parse("x:join").unwrap_err();
        assert!(
            e.contains("unknown flag 'join'") && e.contains("no_exec"),
            "{e}"
        );
        let e = ContainerName::parse("x:exec:more").unwrap_err();
        assert!(e.contains("'exec:more'"), "{e}");
        let e = ContainerName::parse(":exec").unwrap_err();
        assert!(e.contains("empty"), "{e}");
        let e = ContainerName::parse("").unwrap_err();
        assert!(e.contains("empty"), "{e}");
        let e = ContainerName::parse("../etc").unwrap_err();
        assert!(e.contains("starts with '.'"), "{e}");
        let e = ContainerName::parse("a/b").unwrap_err();
        assert!(e.contains("'/'"), "{e}");
        let e = ContainerName::parse("a b:create").unwrap_err();
        assert!(e.contains("' '"), "{e}");
        let e = ContainerName::parse(&"a".repeat(MAX_NAME_LEN + 1)).unwrap_err();
        assert!(e.contains("at most"), "{e}");
        assert!(ContainerName::parse(&"a".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn displays_as_written() {
        assert_eq!(ContainerName::parse("n").unwrap().to_string(), "n:auto");
        assert_eq!(
            ContainerName::parse("n:no_exec").unwrap().to_string(),
            "n:no_exec"
        );
    }
}
