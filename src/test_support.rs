//! Helpers for unit tests that need something of the machine (root, a
//! tool, a daemon). Outside the test command a missing need skips the test
//! with a printed reason; under it (`BERTH_REQUIRE_CLUSTER` set, as
//! tests/run.sh does, on a machine it set up) a skip would be a test that
//! did not test, so it fails instead.

/// Whether `test` must stop because `missing` (what it lacks, and how to get
/// it): prints why and returns true, or panics under the test command.
pub(crate) fn skip_because(test: &str, missing: &str) -> bool {
    if std::env::var_os("BERTH_REQUIRE_CLUSTER").is_some() {
        panic!("{test}: {missing} (the test command, BERTH_REQUIRE_CLUSTER, runs every test)");
    }
    eprintln!("skipped {test}: {missing}");
    true
}

/// Whether `test` must stop because it does not run as root (see
/// `skip_because`).
pub(crate) fn skip_unless_root(test: &str) -> bool {
    !nix::unistd::geteuid().is_root() && skip_because(test, "it needs root")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_present_need_never_skips() {
        if nix::unistd::geteuid().is_root() {
            assert!(!super::skip_unless_root("a_present_need_never_skips"));
        }
    }
}
