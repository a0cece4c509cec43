//! The step's decisions, without Slurm: a snapshot and options in, the
//! choice or the spec out.

use std::path::{Path, PathBuf};

use super::context::{FanoutStep, StepContext};
use super::named::scope_of;
use super::report::Recorded;
use super::spec::{build_spec, hook_env, image_spec, save_target, ImageSpec, SpecError};
use super::*;
use crate::config::{Config, ContainerScope, FanoutMode};
use crate::container::spec::{parse_mounts, Namespace, UserIdentity};
use crate::image::ImageConfig;
use crate::named::Scope;
use crate::store::StoredImage;

fn with_image(image: &str) -> JobOptions {
    JobOptions {
        image: Some(image.into()),
        ..Default::default()
    }
}

fn user() -> UserIdentity {
    UserIdentity {
        uid: 1000,
        gid: 1000,
        groups: vec![1000],
        name: "someone".into(),
        home: "/home/someone".into(),
        shell: "/bin/sh".into(),
        group_names: Default::default(),
    }
}

/// A squashfs file given by path (no store, so no pull user).
fn file_image(config: ImageConfig) -> StoredImage {
    StoredImage {
        squashfs: "/images/a.sqfs".into(),
        config,
        manifest_digest: None,
        reference: None,
    }
}

fn context<'a>(config: &'a Config, report: &'a Recorded, options: JobOptions) -> StepContext<'a> {
    StepContext {
        config,
        report,
        request: StepRequest::resolve(&options, config).unwrap(),
        store: "/var/lib/berth".into(),
        node_state: "/var/lib/berth".into(),
        node: "node1".into(),
        node_count: 1,
        job: 7,
        step: 0,
        user: user(),
        job_env: vec!["KEEP=job".into(), "OTHER=job".into()],
        cwd: Some("/home/someone/work".into()),
        save_to: None,
        batch_script: None,
        fanout: None,
        verbose: false,
        task_prolog: None,
        handover: None,
    }
}

#[test]
fn only_steps_with_an_image_or_a_name_run_in_a_container() {
    let config = Config::default();
    assert!(!wants_container(0, &JobOptions::default(), &config));
    assert!(wants_container(0, &with_image("ubuntu"), &config));
    let named = JobOptions {
        name: Some("c".into()),
        ..Default::default()
    };
    assert!(wants_container(3, &named, &config));
    // The extern step never; the batch step only with sbatch support.
    assert!(!wants_container(
        EXTERN_STEP,
        &with_image("ubuntu"),
        &config
    ));
    assert!(wants_container(BATCH_STEP, &with_image("ubuntu"), &config));
    let no_sbatch = Config {
        sbatch_support: false,
        ..Config::default()
    };
    assert!(!wants_container(
        BATCH_STEP,
        &with_image("ubuntu"),
        &no_sbatch
    ));
}

#[test]
fn a_step_without_a_container_does_nothing_and_says_nothing() {
    let report = Recorded::default();
    let snapshot = Snapshot {
        step: EXTERN_STEP,
        ..Default::default()
    };
    let config = Config::default();
    let started = start(snapshot, with_image("ubuntu"), &config, &report, None).unwrap();
    assert!(started.is_none());
    let started = start(
        Snapshot::default(),
        JobOptions::default(),
        &config,
        &report,
        None,
    )
    .unwrap();
    assert!(started.is_none());
    assert!(report.lines.borrow().is_empty());
}

#[test]
fn the_batch_script_is_bound_read_only_at_its_path() {
    let bind = batch_script_bind(&["/spool/job7/slurm_script".into(), "arg".into()]).unwrap();
    assert_eq!(bind.source, Path::new("/spool/job7/slurm_script"));
    assert_eq!(bind.target, bind.source);
    assert!(bind.read_only);
    let e = batch_script_bind(&["script.sh".into()])
        .map_err(|e| format!("{e:#}"))
        .unwrap_err();
    assert!(e.contains("cannot find the batch script"), "{e:#}");
    assert!(batch_script_bind(&[]).is_err());
}

#[test]
fn a_relative_save_path_is_taken_from_the_jobs_working_directory() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let saved = save_target("out.sqfs", Some(dir.path())).unwrap();
    assert_eq!(saved, dir.path().join("out.sqfs"));
    let e = save_target("out.sqfs", None)
        .map_err(|e| format!("{e:#}"))
        .unwrap_err();
    assert!(
        e.contains("--container-save=out.sqfs: a relative path"),
        "{e:#}"
    );
    let e = save_target("/nonexistent/dir/out.sqfs", None)
        .map_err(|e| format!("{e:#}"))
        .unwrap_err();
    assert!(e.contains("does not exist on this node"), "{e:#}");
}

#[test]
fn the_scope_of_a_name_is_the_sites_except_for_an_unnamed_steps() {
    assert_eq!(scope_of("mine", 7, ContainerScope::Job), Scope::Job(7));
    assert_eq!(scope_of("mine", 7, ContainerScope::Global), Scope::Global);
    // JOB.STEP of this job is that step's container, whatever the site says.
    assert_eq!(scope_of("7.0", 7, ContainerScope::Global), Scope::Job(7));
    assert_eq!(scope_of("7.12", 7, ContainerScope::Global), Scope::Job(7));
    // Another job's numbers, or not a step number, are ordinary names.
    assert_eq!(scope_of("8.0", 7, ContainerScope::Global), Scope::Global);
    assert_eq!(scope_of("7.x", 7, ContainerScope::Global), Scope::Global);
    assert_eq!(scope_of("7.", 7, ContainerScope::Global), Scope::Global);
}

#[test]
fn fanout_roles_come_from_the_snapshot() {
    let snapshot = |node_id| Snapshot {
        node_id,
        node_count: 4,
        ..Default::default()
    };
    // The default (fanout=none): every node pulls.
    assert!(FanoutStep::of(&snapshot(Some(1)), &Config::default())
        .unwrap()
        .is_none());
    let mut config = Config::default();
    config.fanout.mode = FanoutMode::Sbcast;
    config.fanout.min_nodes = 4;
    let step = FanoutStep::of(&snapshot(Some(1)), &config)
        .unwrap()
        .unwrap();
    assert_eq!(step.node_count, 4);
    let e = FanoutStep::of(&snapshot(None), &config)
        .map_err(|e| format!("{e:#}"))
        .unwrap_err();
    assert!(e.contains("SLURM_NODEID"), "{e:#}");
    // Too few nodes, or a shared store (one pull for all): no fan-out.
    config.fanout.min_nodes = 5;
    assert!(FanoutStep::of(&snapshot(Some(1)), &config)
        .unwrap()
        .is_none());
    config.fanout.min_nodes = 2;
    config.store_shared = true;
    assert!(FanoutStep::of(&snapshot(Some(1)), &config)
        .unwrap()
        .is_none());
}

#[test]
fn the_common_spec_resolves_relative_mounts_or_says_why_not() {
    let stored = file_image(ImageConfig::default());
    let inject = Config::default().inject;
    let input = |cwd| ImageSpec {
        stored: &stored,
        hold: None,
        user: user(),
        mounts: parse_mounts("./data:/data:ro,/abs:/abs").unwrap(),
        site_mounts: Vec::new(),
        site_env: Vec::new(),
        cwd,
        workdir: Some("/w".into()),
        inject: &inject,
        request: crate::inject::Request {
            mpi: None,
            gpus: None,
            cdi_devices: Vec::new(),
            ..Default::default()
        },
    };
    let spec = image_spec(input(Some(Path::new("/home/someone")))).unwrap();
    let sources: Vec<&Path> = spec.mounts.iter().map(|m| m.source.as_path()).collect();
    assert_eq!(
        sources,
        [Path::new("/home/someone/data"), Path::new("/abs")]
    );
    assert_eq!(spec.workdir.as_deref(), Some("/w"));
    assert_eq!(spec.squashfs, PathBuf::from("/images/a.sqfs"));
    assert!(spec.sealed_image.is_none());
    assert!(matches!(
        image_spec(input(None)),
        Err(SpecError::RelativeMount)
    ));
}

#[test]
fn a_steps_spec_applies_the_options_and_their_defaults() {
    let config = Config {
        execute_entrypoint: true,
        ..Config::default()
    };
    let report = Recorded::default();
    let image = ImageConfig {
        entrypoint: Some(vec!["/entry".into()]),
        env: vec!["KEEP=image".into(), "PATH=/bin".into()],
        ..ImageConfig::default()
    };
    let stored = file_image(image);
    let mut ctx = context(&config, &report, with_image("/images/a.sqfs"));
    ctx.batch_script = Some(batch_script_bind(&["/spool/script".into()]).unwrap());
    let spec = build_spec(&ctx, &stored, None).unwrap();
    // Writable by default, no home, no remapped root, the node's namespaces.
    assert!(spec.writable && !spec.mount_home && !spec.remap_root);
    assert!(
        spec.image_reader.is_none(),
        "a file by path needs no pull user"
    );
    assert!(spec
        .extra_binds
        .iter()
        .any(|b| b.target == Path::new("/spool/script") && b.read_only));
    // The ENTRYPOINT sees the image's Env, and none of the job's variables
    // without --container-env.
    let run = spec
        .entrypoint
        .as_ref()
        .expect("the image has an ENTRYPOINT");
    assert_eq!(run.command, ["/entry"]);
    assert!(run.env.iter().any(|(n, v)| n == "KEEP" && v == "image"));
    assert!(!run.env.iter().any(|(n, _)| n == "OTHER"));

    let mut options = JobOptions {
        image: Some("/images/a.sqfs".into()),
        writable: Some(false),
        mount_home: Some(true),
        unshare: Some("ipc".into()),
        env: Some("KEEP".into()),
        mounts: Some("./in:/in".into()),
        ..Default::default()
    };
    ctx.request = StepRequest::resolve(&options, &config).unwrap();
    let spec = build_spec(&ctx, &stored, None).unwrap();
    assert!(!spec.writable && spec.mount_home);
    assert_eq!(spec.unshare, [Namespace::parse_list("ipc").unwrap()[0]]);
    assert_eq!(spec.mounts[0].source, Path::new("/home/someone/work/in"));
    let run = spec.entrypoint.as_ref().unwrap();
    assert!(run.env.iter().any(|(n, v)| n == "KEEP" && v == "job"));

    // --no-container-entrypoint wins over the plugstack's default.
    options.entrypoint = Some(false);
    ctx.request = StepRequest::resolve(&options, &config).unwrap();
    assert!(build_spec(&ctx, &stored, None)
        .unwrap()
        .entrypoint
        .is_none());
    // Each failure names its option.
    ctx.cwd = None;
    let e = build_spec(&ctx, &stored, None)
        .map_err(|e| format!("{e:#}"))
        .unwrap_err();
    assert!(
        e.starts_with("--container-mounts: a relative source"),
        "{e:#}"
    );
    assert!(report.at("info").is_empty(), "nothing injected");
}

#[test]
fn site_hooks_get_enroots_settings_under_the_job_env_and_the_container_flags() {
    let mut spec = crate::container::spec::ContainerSpec::new(
        "/images/a.sqfs".into(),
        ImageConfig::default(),
        user(),
    );
    spec.mount_home = true;
    spec.remap_root = false;
    spec.writable = true;
    let settings = [
        "ENROOT_SQUASH_OPTIONS=-comp lzo".to_string(),
        "ENROOT_CACHE_PATH=/site/cache".to_string(),
        "ENROOT_REMAP_ROOT=yes".to_string(),
    ];
    let job = [
        "PATH=/usr/bin".to_string(),
        "ENROOT_CACHE_PATH=/job/cache".to_string(),
    ];
    assert_eq!(
        hook_env(&settings, &job, &spec),
        [
            "ENROOT_SQUASH_OPTIONS=-comp lzo",
            "PATH=/usr/bin",
            "ENROOT_CACHE_PATH=/job/cache",
            "ENROOT_MOUNT_HOME=y",
            "ENROOT_ROOTFS_WRITABLE=y",
        ]
    );
}

#[test]
fn a_site_with_enroots_sharp_hook_gets_its_variables_on_sharp_steps() {
    if !nix::unistd::geteuid().is_root() {
        return; // the site folder must be root's
    }
    let site = tempfile::tempdir().unwrap();
    let hooks = site.path().join("hooks.d");
    std::fs::create_dir(&hooks).unwrap();
    let config = Config {
        enroot_config_path: site.path().to_path_buf(),
        ..Config::default()
    };
    let report = Recorded::default();
    let stored = file_image(ImageConfig {
        env: vec!["NCCL_COLLNET_ENABLE=0".into()],
        ..ImageConfig::default()
    });
    let mut ctx = context(&config, &report, with_image("/images/a.sqfs"));
    ctx.job_env = vec![
        "MELLANOX_VISIBLE_DEVICES=all".into(),
        "SLURM_NETWORK=sharp".into(),
        "SLURM_STEP_NUM_NODES=2".into(),
    ];
    let sharp_vars = |ctx: &StepContext| -> Vec<String> {
        build_spec(ctx, &stored, None)
            .unwrap()
            .image_config
            .env
            .into_iter()
            .filter(|e| e.starts_with("SHARP_") || e.starts_with("NCCL_"))
            .collect()
    };
    assert_eq!(
        sharp_vars(&ctx),
        ["NCCL_COLLNET_ENABLE=0"],
        "no hook, no SHARP"
    );
    let hook = hooks.join("50-sharp.sh");
    std::fs::write(&hook, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    assert_eq!(
        sharp_vars(&ctx),
        [
            "NCCL_COLLNET_ENABLE=0",
            "SHARP_COLL_LOCK_ON_COMM_INIT=1",
            "SHARP_COLL_NUM_COLL_GROUP_RESOURCE_ALLOC_THRESHOLD=0",
            "NCCL_SHARP_GROUP_SIZE_THRESH=2",
        ],
        "the image's own setting wins"
    );
    ctx.job_env.retain(|e| !e.starts_with("SLURM_NETWORK="));
    assert_eq!(
        sharp_vars(&ctx),
        ["NCCL_COLLNET_ENABLE=0"],
        "not a SHARP step"
    );
}
