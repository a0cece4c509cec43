//! The panic and error guard around every SPANK callback: a panic must
//! never unwind into Slurm, and an error becomes a logged message and
//! Slurm's error code.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::handle;

/// Runs one callback body, turning errors and panics into a logged message
/// and Slurm's error code (a panic must never unwind into Slurm).
pub fn guard(callback: &str, body: impl FnOnce() -> Result<(), String>) -> c_int {
    guard_logging(callback, body, handle::log_error)
}

/// [`guard`], logging through `log`.
fn guard_logging(
    callback: &str,
    body: impl FnOnce() -> Result<(), String>,
    log: impl Fn(&str),
) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => 0,
        Ok(Err(message)) => {
            log(&message);
            -1
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            log(&format!("internal error in {callback}: {what}"));
            -1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_in_a_callback_is_an_error_code_and_a_message() {
        let logged = std::cell::RefCell::new(Vec::new());
        let log = |m: &str| logged.borrow_mut().push(m.to_string());
        assert_eq!(guard_logging("cb", || Ok(()), log), 0);
        assert_eq!(guard_logging("cb", || Err("bad".into()), log), -1);
        assert_eq!(
            guard_logging("cb", || -> Result<(), String> { panic!("boom") }, log),
            -1
        );
        assert_eq!(*logged.borrow(), ["bad", "internal error in cb: boom"]);
    }
}
