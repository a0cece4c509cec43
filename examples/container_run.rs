//! Runs a command in a container built from a squashfs file, for manual tests
//! of the container runtime (`tests/container_*.rs` use it too).
//!
//! ```text
//! container_run [--user NAME] [--mounts SRC[:DST[:FLAGS]],...] [--workdir DIR]
//!               [--config IMAGE_CONFIG.json] [--hostname NAME]
//!               [--readonly] [--mount-home] [--unshare net,ipc,uts]
//!               [--remap-root] [--entrypoint]
//!               [--privileged | --unprivileged] [--helper PATH]
//!               IMAGE.sqfs -- COMMAND [ARG...]
//! ```
//!
//! The helper (`berth __holder`) defaults to a `berth` binary next to this
//! one, else the one of the same build (`target/PROFILE/berth`). Exits with
//! the command's status (128 + signal when killed).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use berth::container::{parse_mounts, spawn_holder, ContainerSpec, Mode, Namespace, UserIdentity};
use berth::image::ImageConfig;

fn main() -> ExitCode {
    match run() {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("container_run: {err:#}");
            ExitCode::from(125)
        }
    }
}

/// `berth` beside this binary, else in the folder above (`examples/..`).
fn default_helper() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let beside = exe.with_file_name("berth");
    if beside.is_file() {
        return Ok(beside);
    }
    Ok(exe
        .parent()
        .and_then(|dir| dir.parent())
        .map_or(beside, |dir| dir.join("berth")))
}

fn run() -> anyhow::Result<u8> {
    let mut args = std::env::args().skip(1);
    let mut user = None;
    let mut mounts = Vec::new();
    let mut workdir = None;
    let mut config = ImageConfig::default();
    let mut hostname = None;
    let mut writable = true;
    let mut mount_home = false;
    let mut unshare = Vec::new();
    let mut remap_root = false;
    let mut entrypoint = false;
    let mut mode = Mode::for_current_process();
    let mut helper = default_helper()?;
    let mut image = None;
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--user" => user = Some(value()?),
            "--mounts" => mounts.extend(parse_mounts(&value()?)?),
            "--workdir" => workdir = Some(value()?),
            "--config" => {
                let path = value()?;
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {path}"))?;
                config = serde_json::from_str(&text)
                    .with_context(|| format!("bad image config {path}"))?;
            }
            "--hostname" => hostname = Some(value()?),
            "--readonly" => writable = false,
            "--mount-home" => mount_home = true,
            "--unshare" => {
                unshare = Namespace::parse_list(&value()?).map_err(anyhow::Error::msg)?
            }
            "--remap-root" => remap_root = true,
            "--entrypoint" => entrypoint = true,
            "--privileged" => mode = Mode::Privileged,
            "--unprivileged" => mode = Mode::Unprivileged,
            "--helper" => helper = PathBuf::from(value()?),
            "--" => break,
            other if image.is_none() && !other.starts_with("--") => {
                image = Some(PathBuf::from(other))
            }
            other => bail!("unexpected argument {other:?}"),
        }
    }
    let command: Vec<String> = args.collect();
    let Some(image) = image else {
        bail!("no image given")
    };
    let user = match user {
        None => UserIdentity::current()?,
        Some(name) => {
            let entry =
                nix::unistd::User::from_name(&name)?.with_context(|| format!("no user {name}"))?;
            UserIdentity::lookup(entry.uid.as_raw(), entry.gid.as_raw())?
        }
    };
    let mut spec = ContainerSpec::new(image, config, user);
    spec.mounts = mounts;
    spec.workdir = workdir;
    spec.hostname = hostname;
    spec.writable = writable;
    spec.mount_home = mount_home;
    spec.unshare = unshare;
    spec.remap_root = remap_root;
    let container = spawn_holder(&helper, &spec, mode)?;
    let command = if entrypoint {
        container.command_with_entrypoint(&command)
    } else {
        command
    };
    let env = container.env(std::env::vars());
    let status = container.run(&command, &env)?;
    container.shutdown();
    use std::os::unix::process::ExitStatusExt;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128 + signal as u8,
        _ => 1,
    })
}
