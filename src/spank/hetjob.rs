//! Heterogeneous job lines (`srun A : B`, `sbatch A : B`): Slurm hands a
//! SPANK plugin one set of options for the whole line, so the last
//! component's `--container-*` options would silently apply to every
//! component. A line whose components give different berth options is
//! refused before anything is allocated; one srun per component
//! (`#SBATCH hetjob`, `srun --het-group=N`) gives each its own container.

/// berth's options that take a value (`--container-image IMAGE` is one
/// option with its value, as getopt reads it).
const VALUE_OPTIONS: &[&str] = &[
    "--container-image",
    "--container-mounts",
    "--container-workdir",
    "--container-env",
    "--container-unshare",
    "--container-name",
    "--container-save",
    "--container-mpi",
];

/// The berth options of each `:`-separated component of `args` (a command
/// line without the program name), each as `--option[=value]`.
pub fn options_per_component(args: &[String]) -> Vec<Vec<String>> {
    let mut components = vec![Vec::new()];
    let mut words = args.iter().peekable();
    while let Some(word) = words.next() {
        if word == ":" {
            components.push(Vec::new());
            continue;
        }
        if !(word.starts_with("--container-") || word.starts_with("--no-container-")) {
            continue;
        }
        let option = if !word.contains('=') && VALUE_OPTIONS.contains(&word.as_str()) {
            match words.next() {
                Some(value) => format!("{word}={value}"),
                None => word.clone(),
            }
        } else {
            word.clone()
        };
        components
            .last_mut()
            .expect("one component at least")
            .push(option);
    }
    components
}

/// Fails with what to do when `args` has components that give different
/// berth options.
pub fn check_components(args: &[String]) -> Result<(), String> {
    let components = options_per_component(args);
    let Some(first) = components.first() else {
        return Ok(());
    };
    match components.iter().find(|c| *c != first) {
        None => Ok(()),
        Some(other) => Err(format!(
            "the components of this heterogeneous job (separated by ':') give different \
             container options ({} and {}): Slurm hands berth one set of options per command, \
             so every component would run in the last one's container. Give each component its \
             own srun (in a batch script with '#SBATCH hetjob': srun --het-group=0 \
             --container-image=A ...; srun --het-group=1 --container-image=B ...), or give all \
             components the same options",
            show(first),
            show(other)
        )),
    }
}

fn show(options: &[String]) -> String {
    if options.is_empty() {
        "none".to_string()
    } else {
        options.join(" ")
    }
}

/// [`check_components`] for this process's own command line (srun, sbatch
/// or salloc).
pub fn check_own_command_line() -> Result<(), String> {
    let Ok(bytes) = std::fs::read("/proc/self/cmdline") else {
        return Ok(());
    };
    let args: Vec<String> = bytes
        .split(|b| *b == 0)
        .skip(1)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    check_components(&args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn components_with_different_images_are_refused() {
        let e = check_components(&words(
            "-N1 --container-image=a true : -N1 --container-image b true",
        ))
        .unwrap_err();
        assert!(
            e.contains("--container-image=a and --container-image=b") && e.contains("--het-group"),
            "{e}"
        );
        let e = check_components(&words("-N1 true : -N1 --container-image=b true")).unwrap_err();
        assert!(e.contains("none and --container-image=b"), "{e}");
    }

    #[test]
    fn one_component_or_the_same_options_pass() {
        for line in [
            "-N1 --container-image=a --container-remap-root sh -c x",
            "--container-image=a -n1 true : --container-image=a -n2 true",
            "-N1 true : -N2 hostname",
            "",
        ] {
            assert!(check_components(&words(line)).is_ok(), "{line}");
        }
    }
}
