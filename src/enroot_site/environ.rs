//! `environ.d/*.env`: `NAME=VALUE` lines, with `${NAME}` replaced by the
//! job's value, read with the rules enroot applies to an environment file
//! (the same as for an image's `/etc/environment`,
//! [`crate::image::carried::from_enroot_environment`]).

use super::fstab::substitute;

/// The variables of one environment file's `text`, in file order.
pub fn parse(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let substituted: Vec<String> = text.lines().map(|line| substitute(line, lookup)).collect();
    crate::image::carried::from_enroot_environment(&substituted.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_enroots_terminal_file_and_site_lines() {
        let lookup = |name: &str| (name == "TERM").then(|| "xterm".to_string());
        let text = "TERM=${TERM}\n# comment\nSITE_SCRATCH=\"/scratch/${USER}\"\nENROOT_X=1\n";
        assert_eq!(
            parse(text, &lookup),
            ["TERM=xterm", "SITE_SCRATCH=/scratch/"]
        );
    }
}
