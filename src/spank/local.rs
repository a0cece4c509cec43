//! srun, sbatch and salloc: everything is checked here, before Slurm allocates.

use super::options::JobOptions;

/// Checks the combination of options (each value was checked when given).
pub fn check_options(options: &JobOptions) -> Result<(), String> {
    if options.image.is_some() {
        return Ok(());
    }
    let given = options.given_without_image();
    if given.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} given without --container-image: add --container-image=IMAGE or drop {}",
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
    }
}
