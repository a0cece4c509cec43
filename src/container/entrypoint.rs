//! The command a task runs when the image entrypoint is enabled
//! (`--container-entrypoint`), with pyxis's semantics.

use crate::image::ImageConfig;

/// ENTRYPOINT followed by `argv`; with an empty `argv`, ENTRYPOINT followed by
/// the image's CMD. Without an ENTRYPOINT, `argv` as is (or CMD when `argv`
/// is empty), so the result is what the task runs.
pub fn command_with_entrypoint(config: &ImageConfig, argv: &[String]) -> Vec<String> {
    let entrypoint = config.entrypoint.as_deref().unwrap_or_default();
    let rest = if argv.is_empty() {
        config.cmd.as_deref().unwrap_or_default()
    } else {
        argv
    };
    entrypoint.iter().chain(rest).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn config(entrypoint: Option<&[&str]>, cmd: Option<&[&str]>) -> ImageConfig {
        ImageConfig {
            entrypoint: entrypoint.map(strings),
            cmd: cmd.map(strings),
            ..ImageConfig::default()
        }
    }

    #[test]
    fn entrypoint_then_arguments() {
        let config = config(Some(&["/init.sh", "-v"]), Some(&["bash"]));
        assert_eq!(
            command_with_entrypoint(&config, &strings(&["python", "train.py"])),
            strings(&["/init.sh", "-v", "python", "train.py"])
        );
    }

    #[test]
    fn entrypoint_then_cmd_without_arguments() {
        let config = config(Some(&["/init.sh"]), Some(&["bash", "-l"]));
        assert_eq!(
            command_with_entrypoint(&config, &[]),
            strings(&["/init.sh", "bash", "-l"])
        );
    }

    #[test]
    fn no_entrypoint_keeps_the_command() {
        let config = config(None, Some(&["bash"]));
        assert_eq!(
            command_with_entrypoint(&config, &strings(&["id"])),
            strings(&["id"])
        );
        assert_eq!(command_with_entrypoint(&config, &[]), strings(&["bash"]));
        assert!(command_with_entrypoint(&ImageConfig::default(), &[]).is_empty());
    }
}
