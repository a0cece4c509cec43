//! srun, sbatch and salloc: everything is checked here, before Slurm allocates.
//! A `--container-name` alone is valid: whether the container exists is only
//! known on the nodes.

use super::options::JobOptions;

/// Checks the combination of options (each value was checked when given).
pub fn check_options(options: &JobOptions) -> Result<(), String> {
    if crate::step::manage::wanted(options) {
        return check_management(options);
    }
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

/// `--container-remove` and `--container-list` make a step of their own:
/// the step's command runs on the host, so no container option goes with
/// them.
fn check_management(options: &JobOptions) -> Result<(), String> {
    let mut others: Vec<&str> = Vec::new();
    if options.image.is_some() {
        others.push("--container-image");
    }
    if options.name.is_some() {
        others.push("--container-name");
    }
    others.extend(
        options
            .given_without_image()
            .into_iter()
            .filter(|o| !matches!(*o, "--container-remove" | "--container-list")),
    );
    if others.is_empty() {
        return Ok(());
    }
    Err(format!(
        "--container-remove and --container-list manage your named containers and run the \
         step's command on the host: they cannot be combined with {}; run them in a step of \
         their own, e.g. srun --container-remove=NAME true",
        others.join(", ")
    ))
}

/// sbatch and salloc: `--container-remove` and `--container-list` act on the
/// nodes of one step, so they are srun's only.
pub fn refuse_management_in_allocation(options: &JobOptions) -> Result<(), String> {
    if crate::step::manage::wanted(options) {
        return Err(
            "--container-remove and --container-list act on the nodes of one step: give them \
             to srun (e.g. srun -N2 --container-list true inside the job), not to sbatch or salloc"
                .into(),
        );
    }
    Ok(())
}

/// Whether the options ask berth for anything: a container (an image or
/// a name) or the management of named ones (`--container-list`,
/// `--container-remove`). slurmstepd fails such a step when its
/// configuration is broken.
pub fn wants_berth(options: &JobOptions) -> bool {
    options.image.is_some() || options.name.is_some() || crate::step::manage::wanted(options)
}

/// Refuses a container step where Slurm puts the job in a user namespace
/// of its own (25.11's `namespace/linux` with `CLONE_NEWUSER`): a task inside
/// it cannot join the container's user namespace. Checked at submission
/// (srun, sbatch, salloc) and again in slurmstepd, with the slurm.conf that
/// process reads.
pub fn check_slurm_namespaces(options: &JobOptions) -> Result<(), String> {
    if options.image.is_none() && options.name.is_none() {
        return Ok(());
    }
    let conf = crate::slurm_conf::slurm_conf_path();
    let user_ns = crate::slurm_conf::jobs_get_a_user_namespace(&conf)
        .map_err(|e| format!("cannot read Slurm's namespace settings: {e:#}"))?;
    if !user_ns {
        return Ok(());
    }
    Err(format!(
        "--container-image and --container-name cannot work on this cluster: Slurm puts every \
         job in a user namespace of its own (NamespaceType=namespace/linux in {} with \
         CLONE_NEWUSER in clone_ns_flags of namespace.yaml), and a task inside it cannot enter \
         the container's; ask the site to drop CLONE_NEWUSER from clone_ns_flags on the nodes \
         that run containers",
        conf.display()
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

    #[test]
    fn management_options_make_a_step_of_their_own() {
        let remove = JobOptions {
            remove: Some("a,b".into()),
            list: Some(true),
            ..Default::default()
        };
        assert!(check_options(&remove).is_ok());
        let with_image = JobOptions {
            image: Some("ubuntu".into()),
            workdir: Some("/w".into()),
            ..remove.clone()
        };
        let e = check_options(&with_image).unwrap_err();
        assert!(
            e.contains("cannot be combined with --container-image, --container-workdir"),
            "{e}"
        );
        let e = refuse_management_in_allocation(&remove).unwrap_err();
        assert!(e.contains("give them to srun"), "{e}");
        assert!(refuse_management_in_allocation(&JobOptions::default()).is_ok());
    }
}
