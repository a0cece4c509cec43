//! The environment a task sees inside the container.

use crate::image::ImageConfig;

/// The job's locale variables: kept out of the container unless
/// `--container-env` names them (as with pyxis), since the image may lack
/// the job's locale; the image's own values apply.
pub const JOB_LOCALE_VARIABLES: [&str; 3] = ["LANG", "LANGUAGE", "LC_ALL"];

/// Builds a task's environment: every variable of the job passes through, and
/// the image's `Env` entries override them (so the image's `PATH` wins).
///
/// The job's variables keep their order; variables only the image sets follow,
/// in image order. A name set twice keeps its last value at its first place.
pub fn task_env<I>(job_env: I, image: &ImageConfig) -> Vec<(String, String)>
where
    I: IntoIterator<Item = (String, String)>,
{
    let mut env: Vec<(String, String)> = Vec::new();
    let mut set = |name: &str, value: &str| match env.iter_mut().find(|(n, _)| n == name) {
        Some(slot) => slot.1 = value.to_string(),
        None => env.push((name.to_string(), value.to_string())),
    };
    for (name, value) in job_env {
        set(&name, &value);
    }
    for (name, value) in image.env_pairs() {
        set(name, value);
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn image_overrides_job_and_appends_new() {
        let image = ImageConfig {
            env: vec![
                "PATH=/opt/bin:/usr/bin".into(),
                "CUDA_VERSION=12.4".into(),
                "malformed".into(),
            ],
            ..ImageConfig::default()
        };
        let job = pairs(&[
            ("HOME", "/home/alice"),
            ("PATH", "/usr/local/bin:/usr/bin"),
            ("SLURM_PROCID", "3"),
        ]);
        assert_eq!(
            task_env(job, &image),
            pairs(&[
                ("HOME", "/home/alice"),
                ("PATH", "/opt/bin:/usr/bin"),
                ("SLURM_PROCID", "3"),
                ("CUDA_VERSION", "12.4"),
            ])
        );
    }

    #[test]
    fn values_may_contain_equals_and_be_empty() {
        let image = ImageConfig {
            env: vec!["A=b=c".into(), "EMPTY=".into()],
            ..ImageConfig::default()
        };
        assert_eq!(
            task_env(Vec::new(), &image),
            pairs(&[("A", "b=c"), ("EMPTY", "")])
        );
    }

    #[test]
    fn duplicate_names_keep_last_value() {
        let image = ImageConfig {
            env: vec!["X=1".into(), "X=2".into()],
            ..ImageConfig::default()
        };
        assert_eq!(task_env(pairs(&[("X", "0")]), &image), pairs(&[("X", "2")]));
    }
}
