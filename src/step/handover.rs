//! `SlurmdParameters=contain_spank`: the process that builds a step's
//! container (a short-lived clone of slurmstepd) is not the one that holds
//! it while the tasks run. Before the step publishes its record for other
//! steps to join, it hands every descriptor over, so that the record names
//! the process that holds them ([`crate::named::HeldElsewhere`]).

use std::os::fd::RawFd;

use crate::named::HeldElsewhere;

/// Hands a step's descriptors to the process that holds them while the
/// step's tasks run.
pub trait Handover {
    /// Hands `fds` over, in order; says where they are held now.
    fn hand_over(&self, fds: &[RawFd]) -> Result<HeldElsewhere, String>;
}
