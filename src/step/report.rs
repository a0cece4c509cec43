//! How the step tells what it does: a small trait in place of Slurm's log,
//! so that the step runs (and is tested) without SPANK.

/// Where the step's messages go. The plugin writes them to Slurm's log and
/// to srun's terminal; a test records them.
pub trait Report {
    /// An error the user and the node's log should both see.
    fn error(&self, message: &str);
    /// A line for the node's log at `log_level=info`.
    fn info(&self, message: &str);
    /// A line for the node's log at `log_level=verbose`.
    fn verbose(&self, message: &str);
    /// A line for the node's log at `log_level=debug`.
    fn debug(&self, message: &str);
    /// A line shown to the user on srun's terminal (progress, warnings).
    fn user(&self, message: &str);
}

/// A [`Report`] that keeps every message, for tests.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Recorded {
    /// `(level, message)`, in order; the level is the method's name.
    pub(crate) lines: std::cell::RefCell<Vec<(&'static str, String)>>,
}

#[cfg(test)]
impl Recorded {
    /// The messages given at `level`.
    pub(crate) fn at(&self, level: &str) -> Vec<String> {
        self.lines
            .borrow()
            .iter()
            .filter(|(l, _)| *l == level)
            .map(|(_, m)| m.clone())
            .collect()
    }

    fn push(&self, level: &'static str, message: &str) {
        self.lines.borrow_mut().push((level, message.to_string()));
    }
}

#[cfg(test)]
impl Report for Recorded {
    fn error(&self, message: &str) {
        self.push("error", message);
    }
    fn info(&self, message: &str) {
        self.push("info", message);
    }
    fn verbose(&self, message: &str) {
        self.push("verbose", message);
    }
    fn debug(&self, message: &str) {
        self.push("debug", message);
    }
    fn user(&self, message: &str) {
        self.push("user", message);
    }
}
