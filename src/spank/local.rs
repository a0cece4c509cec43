//! srun, sbatch and salloc: everything is checked here, before Slurm allocates.
//! A `--container-name` alone is valid: whether the container exists is only
//! known on the nodes.

use super::options::JobOptions;

/// Checks the combination of options (each value was checked when given).
pub fn check_options(options: &JobOptions) -> Result<(), String> {
    if options.image.is_some() || options.name.is_some() {
        return Ok(());
    }
    let given = options.given_without_image();
    if given.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} given without --container-image or --container-name: add \
         --container-image=IMAGE (or --container-name=NAME of an existing container) or drop {}",
        given.join(" and "),
        if given.len() == 1 { "it" } else { "them" }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_without_image_are_an_error() {
        let opts = JobOptions {
            mounts: Some("/a:/b".into()),
            ..Default::default()
        };
        let e = check_options(&opts).unwrap_err();
        assert!(
            e.contains("--container-mounts given without --container-image"),
            "{e}"
        );
        assert!(check_options(&JobOptions::default()).is_ok());
        let opts = JobOptions {
            image: Some("ubuntu".into()),
            workdir: Some("/w".into()),
            ..Default::default()
        };
        assert!(check_options(&opts).is_ok());
        // A name alone is valid (the container may exist); save needs one of them.
        let opts = JobOptions {
            name: Some("n".into()),
            workdir: Some("/w".into()),
            ..Default::default()
        };
        assert!(check_options(&opts).is_ok());
        let opts = JobOptions {
            save: Some("/tmp/x.sqfs".into()),
            ..Default::default()
        };
        let e = check_options(&opts).unwrap_err();
        assert!(e.contains("--container-save given without"), "{e}");
    }
}
