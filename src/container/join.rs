//! A built container (its namespaces, held by descriptors) and the ways into
//! it: [`Container::join`] for a process that is about to exec (a Slurm task),
//! [`Container::run`] for a command started from here (the CLI).

use std::ffi::OsString;
use std::ffi::{CStr, CString};
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{bail, Context};
use nix::errno::Errno;
use nix::sched::{setns, CloneFlags};
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

use crate::container::entrypoint::{command_with_entrypoint, EntrypointOutcome};
use crate::container::env::task_env;
use crate::container::fuse::{self, Daemon};
use crate::container::seccomp;
use crate::container::spec::{ContainerSpec, Namespace, UserIdentity};
use crate::image::ImageConfig;

/// The `PATH` searched when the task environment has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A container's namespaces, kept alive by open descriptors.
///
/// The namespaces (and every mount in them, and the loop device under the
/// image) live as long as this value or any process that joined them. Drop
/// it, or call [`Container::shutdown`], when no more tasks will join; in
/// unprivileged mode that also stops the FUSE daemons serving the image.
#[derive(Debug)]
pub struct Container {
    user_ns: OwnedFd,
    mount_ns: OwnedFd,
    /// The other namespaces of its own (UTS, network, IPC), in join order.
    namespaces: Vec<(Namespace, OwnedFd)>,
    workdir: String,
    /// Install the remap-root seccomp filter in each process that enters.
    remap_root: bool,
    image_config: ImageConfig,
    user: UserIdentity,
    daemons: Vec<Daemon>,
    /// The process that owns the daemons; forked copies must not stop them.
    owner_pid: u32,
    /// What the image ENTRYPOINT left at creation, when it ran.
    entrypoint: Option<EntrypointOutcome>,
    /// What the holder warned about at creation.
    warnings: Vec<String>,
    /// What the holder mounted at creation (see [`Container::mount_table`]).
    mount_table: Vec<String>,
}

/// The step of entering a container that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    SwitchUser = 1,
    UserNamespace = 2,
    UtsNamespace = 3,
    MountNamespace = 4,
    Workdir = 5,
    Exec = 6,
    IpcNamespace = 7,
    NetNamespace = 8,
    Seccomp = 9,
    NoNewPrivs = 10,
}

impl Step {
    fn from_code(code: u8) -> Option<Step> {
        [
            Step::SwitchUser,
            Step::UserNamespace,
            Step::UtsNamespace,
            Step::MountNamespace,
            Step::Workdir,
            Step::Exec,
            Step::IpcNamespace,
            Step::NetNamespace,
            Step::Seccomp,
            Step::NoNewPrivs,
        ]
        .into_iter()
        .find(|step| *step as u8 == code)
    }
}

impl Container {
    pub(crate) fn new(
        user_ns: OwnedFd,
        mount_ns: OwnedFd,
        namespaces: Vec<(Namespace, OwnedFd)>,
        spec: &ContainerSpec,
        daemons: Vec<Daemon>,
    ) -> Container {
        Container {
            user_ns,
            mount_ns,
            namespaces,
            workdir: spec.effective_workdir().to_string(),
            remap_root: spec.remap_root,
            image_config: spec.image_config.clone(),
            user: spec.user.clone(),
            daemons,
            owner_pid: std::process::id(),
            entrypoint: None,
            warnings: Vec::new(),
            mount_table: Vec::new(),
        }
    }

    pub(crate) fn set_mount_table(&mut self, table: Vec<String>) {
        self.mount_table = table;
    }

    /// What the holder mounted, one fstab-like line each
    /// (`SOURCE TARGET TYPE OPTIONS # WHY`), in order.
    pub fn mount_table(&self) -> &[String] {
        &self.mount_table
    }

    pub(crate) fn set_warnings(&mut self, warnings: Vec<String>) {
        self.warnings = warnings;
    }

    /// What the user should know about how the container was built (the
    /// image's files could not be made the user's, ...).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Adds variables (`NAME=VALUE`) over the image's for every task (what
    /// the site's hooks appended).
    pub(crate) fn add_env(&mut self, env: Vec<String>) {
        self.image_config.env.extend(env);
    }

    pub(crate) fn set_entrypoint_outcome(&mut self, outcome: Option<EntrypointOutcome>) {
        self.entrypoint = outcome;
    }

    /// What the image ENTRYPOINT left when it ran at creation
    /// ([`ContainerSpec::entrypoint`]): environment changes for every task,
    /// and its output.
    pub fn entrypoint_outcome(&self) -> Option<&EntrypointOutcome> {
        self.entrypoint.as_ref()
    }

    /// A container from namespace descriptors opened elsewhere (those of a
    /// running step, see [`crate::named`]), described by the `spec` it was
    /// built from. It owns no FUSE daemons.
    pub fn from_namespaces(
        user_ns: OwnedFd,
        mount_ns: OwnedFd,
        namespaces: Vec<(Namespace, OwnedFd)>,
        spec: &ContainerSpec,
    ) -> Container {
        Container::new(user_ns, mount_ns, namespaces, spec, Vec::new())
    }

    /// Its namespace descriptors as `(kind, fd)`, user and mount first; `kind`
    /// is the name in `/proc/PID/ns/`.
    pub fn namespace_fds(&self) -> Vec<(&'static str, RawFd)> {
        let mut fds = vec![
            ("user", self.user_ns.as_raw_fd()),
            ("mnt", self.mount_ns.as_raw_fd()),
        ];
        fds.extend(
            self.namespaces
                .iter()
                .map(|(kind, fd)| (kind.name(), fd.as_raw_fd())),
        );
        fds
    }

    /// Takes `fds` as its namespace descriptors, in the order of
    /// [`Container::namespace_fds`]: this process's copies of descriptors
    /// that another process (a clone of slurmstepd under `contain_spank`)
    /// opened. The numbers held before are that process's, not this one's:
    /// they are forgotten, never closed.
    pub fn adopt_namespace_fds(&mut self, fds: Vec<OwnedFd>) -> anyhow::Result<()> {
        let want = 2 + self.namespaces.len();
        if fds.len() != want {
            anyhow::bail!(
                "expected {want} namespace descriptors of the container, got {}",
                fds.len()
            );
        }
        let mut fds = fds.into_iter();
        let mut next = || fds.next().expect("counted above");
        std::mem::forget(std::mem::replace(&mut self.user_ns, next()));
        std::mem::forget(std::mem::replace(&mut self.mount_ns, next()));
        for (_, fd) in &mut self.namespaces {
            std::mem::forget(std::mem::replace(fd, next()));
        }
        Ok(())
    }

    /// The directory tasks start in.
    pub fn workdir(&self) -> &str {
        &self.workdir
    }

    /// The user the container was built for.
    pub fn user(&self) -> &UserIdentity {
        &self.user
    }

    /// Process ids of the FUSE daemons serving the image (unprivileged mode;
    /// empty in privileged mode).
    pub fn fuse_daemon_pids(&self) -> Vec<i32> {
        self.daemons.iter().map(Daemon::pid).collect()
    }

    /// The command a task runs with the image entrypoint enabled
    /// (`--container-entrypoint`): ENTRYPOINT + `argv`, or ENTRYPOINT + CMD
    /// when `argv` is empty (see [`command_with_entrypoint`]).
    pub fn command_with_entrypoint(&self, argv: &[String]) -> Vec<String> {
        command_with_entrypoint(&self.image_config, argv)
    }

    /// A task's environment: `job_env` with the image's `Env` on top
    /// (see [`task_env`]).
    pub fn env<I>(&self, job_env: I) -> Vec<(String, String)>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        task_env(job_env, &self.image_config)
    }

    /// Moves the calling process into the container: its user namespace, its
    /// UTS, network and IPC namespaces (those it has of its own), its mount
    /// namespace, and the working directory; with remap-root, it also gets the
    /// seccomp filter that makes chown and set*id calls succeed without
    /// effect. The process must be single-threaded and should exec
    /// soon after (a Slurm task in `slurm_spank_task_init`, running as the user).
    pub fn join(&self) -> anyhow::Result<()> {
        let workdir = CString::new(self.workdir.as_bytes())
            .with_context(|| format!("working directory {:?} contains a NUL byte", self.workdir))?;
        self.enter(&workdir)
            .map_err(|(step, errno)| anyhow::anyhow!(self.describe(step, errno, None)))
    }

    /// Runs `argv` inside the container with exactly the environment `env`
    /// (build it with [`Container::env`]) and waits for it.
    ///
    /// The command runs in a forked child that, when the caller is root and the
    /// container's user is not, first switches to the user; then joins the
    /// container and execs `argv[0]`, searched in the `PATH` of `env`. SIGINT
    /// and SIGTERM sent to the caller meanwhile are forwarded to the child.
    /// Not for concurrent use from several threads.
    pub fn run(&self, argv: &[String], env: &[(String, String)]) -> anyhow::Result<ExitStatus> {
        let command = PreparedCommand::new(self, argv, env)?;
        let (report_read, report_write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("cannot create a pipe")?;
        let forwarding = SignalForwarding::install()?;
        // SAFETY: the child only makes raw syscalls on data prepared above
        // (no allocation, no locks) until it execs or exits.
        let fork = unsafe { nix::unistd::fork() }.context("cannot fork to run the command")?;
        let child = match fork {
            nix::unistd::ForkResult::Child => {
                drop(report_read);
                self.exec_in_child(&command, report_write)
            }
            nix::unistd::ForkResult::Parent { child } => child.as_raw(),
        };
        forwarding.forward_to(child);
        drop(report_write);
        // The pipe closes on exec (success) or carries the failed step and errno.
        let mut report = Vec::new();
        let read = std::fs::File::from(report_read).read_to_end(&mut report);
        let status = wait_for(child);
        drop(forwarding);
        read.context("cannot read the command's start-up report")?;
        let status = status?;
        if let [code, errno @ ..] = report.as_slice() {
            let step = Step::from_code(*code).unwrap_or(Step::Exec);
            let errno = Errno::from_raw(i32::from_ne_bytes(errno.try_into().unwrap_or_default()));
            bail!(self.describe(step, errno, Some((&argv[0], &command.path))));
        }
        Ok(status)
    }

    /// The forked child of [`Container::run`]: switch user, join, exec; on
    /// failure write the step and errno to `report` and exit 127.
    fn exec_in_child(&self, command: &PreparedCommand, report: OwnedFd) -> ! {
        let failure = (|| -> Result<std::convert::Infallible, (Step, Errno)> {
            if command.switch_to_user {
                crate::privilege::become_user(self.user.uid, self.user.gid, &command.groups)
                    .map_err(|err| (Step::SwitchUser, errno_of(&err)))?;
            }
            self.enter(&command.workdir)?;
            Err((Step::Exec, command.exec()))
        })();
        let (step, errno) = match failure {
            Err(failure) => failure,
            Ok(never) => match never {},
        };
        let mut message = [0u8; 5];
        message[0] = step as u8;
        message[1..].copy_from_slice(&(errno as i32).to_ne_bytes());
        // SAFETY: write and _exit are async-signal-safe; the buffer is valid.
        unsafe {
            libc::write(report.as_raw_fd(), message.as_ptr().cast(), message.len());
            libc::_exit(127);
        }
    }

    /// Stops the FUSE daemons (unprivileged mode) and closes the namespaces.
    /// Processes still inside keep the namespaces, but lose the image.
    pub fn shutdown(self) {
        drop(self);
    }

    /// setns into the namespaces and chdir; raw syscalls only (used after fork).
    fn enter(&self, workdir: &CStr) -> Result<(), (Step, Errno)> {
        let others: Vec<(Namespace, BorrowedFd<'_>)> = self
            .namespaces
            .iter()
            .map(|(kind, fd)| (*kind, fd.as_fd()))
            .collect();
        enter_fds(
            self.user_ns.as_fd(),
            &others,
            self.mount_ns.as_fd(),
            workdir,
            self.remap_root,
        )
    }

    /// The words to put before a task's command so that it enters the
    /// container by exec (`HELPER __enter ... --`, see [`enter_main`]),
    /// for Slurm releases that let a plugin prepend to the task's argv.
    /// Call it in the task's own process just before Slurm execs it: it
    /// lets the namespace descriptors survive that exec (in this process
    /// only; `__enter` closes them again before it runs the command).
    pub fn enter_prefix(&self, helper_exe: &Path) -> anyhow::Result<Vec<String>> {
        let mut words = vec![
            helper_exe.to_string_lossy().into_owned(),
            ENTER_ARG.to_string(),
        ];
        for (kind, fd) in self.namespace_fds() {
            keep_open_across_exec(fd).with_context(|| {
                format!("cannot pass the container's {kind} namespace to the task")
            })?;
            words.push(format!("{kind}={fd}"));
        }
        words.push(format!("remap_root={}", u8::from(self.remap_root)));
        words.push(format!("workdir={}", self.workdir));
        words.push("--".to_string());
        Ok(words)
    }

    fn describe(&self, step: Step, errno: Errno, command: Option<(&str, &str)>) -> String {
        let user = &self.user;
        match step {
            Step::SwitchUser => format!(
                "cannot switch to user {} (uid {}, gid {}) to enter the container: {errno}",
                user.name, user.uid, user.gid
            ),
            Step::UserNamespace => format!(
                "cannot join the container's user namespace (setns): {errno}; the caller must be \
                 single-threaded and be user {} (uid {}) or root",
                user.name, user.uid
            ),
            Step::UtsNamespace => {
                format!("cannot join the container's UTS namespace (setns): {errno}")
            }
            Step::IpcNamespace => {
                format!("cannot join the container's IPC namespace (setns): {errno}")
            }
            Step::NetNamespace => {
                format!("cannot join the container's network namespace (setns): {errno}")
            }
            Step::Seccomp => format!(
                "cannot install the seccomp filter of --container-remap-root: {errno}; run \
                 without --container-remap-root"
            ),
            Step::MountNamespace => {
                format!("cannot join the container's mount namespace (setns): {errno}")
            }
            Step::NoNewPrivs => {
                format!("cannot set no_new_privs for the container's processes: {errno}")
            }
            Step::Workdir => format!(
                "cannot change to the working directory {} in the container: {errno}; does it \
                 exist in the image? Choose another with --container-workdir",
                self.workdir
            ),
            Step::Exec => match command {
                Some((program, path)) if errno == Errno::ENOENT && !program.contains('/') => {
                    format!("command '{program}' not found in the container (PATH={path})")
                }
                Some((program, _)) => format!("cannot run '{program}' in the container: {errno}"),
                None => format!("cannot run the command in the container: {errno}"),
            },
        }
    }
}

/// setns into the user namespace, the others in their order, then the
/// mount namespace; chdir; no_new_privs; the remap-root filter. Raw
/// syscalls only (used after fork).
fn enter_fds(
    user_ns: BorrowedFd<'_>,
    others: &[(Namespace, BorrowedFd<'_>)],
    mount_ns: BorrowedFd<'_>,
    workdir: &CStr,
    remap_root: bool,
) -> Result<(), (Step, Errno)> {
    setns(user_ns, CloneFlags::CLONE_NEWUSER).map_err(|errno| (Step::UserNamespace, errno))?;
    for (kind, fd) in others {
        let (flag, step) = match kind {
            Namespace::Uts => (CloneFlags::CLONE_NEWUTS, Step::UtsNamespace),
            Namespace::Ipc => (CloneFlags::CLONE_NEWIPC, Step::IpcNamespace),
            Namespace::Net => (CloneFlags::CLONE_NEWNET, Step::NetNamespace),
        };
        setns(fd, flag).map_err(|errno| (step, errno))?;
    }
    setns(mount_ns, CloneFlags::CLONE_NEWNS).map_err(|errno| (Step::MountNamespace, errno))?;
    nix::unistd::chdir(workdir).map_err(|errno| (Step::Workdir, errno))?;
    // A setuid or file-capability binary in the image never gives privilege
    // (the image is also mounted nosuid).
    // SAFETY: prctl with integer arguments only; async-signal-safe.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err((Step::NoNewPrivs, Errno::last()));
    }
    if remap_root {
        seccomp::install_remap_root_filter().map_err(|err| (Step::Seccomp, errno_of(&err)))?;
    }
    Ok(())
}

/// Clears close-on-exec on `fd` in this process.
fn keep_open_across_exec(fd: RawFd) -> anyhow::Result<()> {
    // SAFETY: fcntl on a descriptor this process owns, integer arguments only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// The hidden verb of the helper binary that enters a container by exec.
pub const ENTER_ARG: &str = "__enter";

/// `berth __enter user=FD [uts=FD] [ipc=FD] [net=FD] mnt=FD remap_root=0|1
/// workdir=DIR -- COMMAND...` (the words of [`Container::enter_prefix`]):
/// joins the namespaces held by the inherited descriptors, closes them,
/// changes to DIR and execs COMMAND, searched in this process's `PATH`,
/// with this process's environment. The process stays the same (pid,
/// cgroup, parent, signal mask); only SIGPIPE, which the Rust runtime
/// ignores, is set back to its default first. On failure it says why on
/// stderr and exits 1 (127 when the command is not found, 126 when it cannot
/// run).
pub fn enter_main(args: &[OsString]) -> ! {
    let (code, message) = match enter_and_exec(args) {
        Ok(never) => match never {},
        Err(failure) => failure,
    };
    eprintln!("berth: {message}");
    std::process::exit(code)
}

/// The work of [`enter_main`]: returns only on failure, with the exit code
/// and message.
fn enter_and_exec(args: &[OsString]) -> Result<std::convert::Infallible, (i32, String)> {
    let usage = |what: &str| {
        (
            1,
            format!("__enter: {what} (this verb is for the Slurm plugin only)"),
        )
    };
    let split = args
        .iter()
        .position(|a| a == "--")
        .ok_or_else(|| usage("no '--' before the command"))?;
    let (settings, command) = (&args[..split], &args[split + 1..]);
    if command.is_empty() {
        return Err(usage("no command after '--'"));
    }
    let mut user_ns = None;
    let mut mount_ns = None;
    let mut others = Vec::new();
    let mut workdir = None;
    let mut remap_root = false;
    for word in settings {
        let word = word
            .to_str()
            .ok_or_else(|| usage("a setting is not UTF-8"))?;
        let (key, value) = word
            .split_once('=')
            .ok_or_else(|| usage(&format!("bad setting '{word}'")))?;
        let fd = || -> Result<BorrowedFd<'static>, (i32, String)> {
            let raw: RawFd = value
                .parse()
                .map_err(|_| usage(&format!("bad descriptor in '{word}'")))?;
            // SAFETY: the plugin left this descriptor open for this process,
            // which uses it only here, before exec, and never closes it while
            // borrowed (the descriptors are closed after the last setns).
            Ok(unsafe { BorrowedFd::borrow_raw(raw) })
        };
        match key {
            "user" => user_ns = Some(fd()?),
            "mnt" => mount_ns = Some(fd()?),
            "uts" => others.push((Namespace::Uts, fd()?)),
            "ipc" => others.push((Namespace::Ipc, fd()?)),
            "net" => others.push((Namespace::Net, fd()?)),
            "remap_root" => remap_root = value == "1",
            "workdir" => workdir = Some(value.to_string()),
            _ => return Err(usage(&format!("unknown setting '{word}'"))),
        }
    }
    let (Some(user_ns), Some(mount_ns), Some(workdir)) = (user_ns, mount_ns, workdir) else {
        return Err(usage(
            "the user and mount namespaces and the workdir are required",
        ));
    };
    let workdir_c = CString::new(workdir.as_bytes()).map_err(|_| usage("workdir has a NUL"))?;
    let program = CString::new(command[0].as_bytes()).map_err(|_| usage("command has a NUL"))?;
    let argv_c = to_cstrings(command.iter().map(|a| a.as_bytes()))
        .map_err(|_| usage("a command argument has a NUL"))?;
    let argv = null_terminated(&argv_c);
    let fds: Vec<RawFd> = std::iter::once(user_ns.as_raw_fd())
        .chain(others.iter().map(|(_, fd)| fd.as_raw_fd()))
        .chain(std::iter::once(mount_ns.as_raw_fd()))
        .collect();
    let entered = enter_fds(user_ns, &others, mount_ns, &workdir_c, remap_root);
    for fd in fds {
        // SAFETY: these descriptors were passed to this process for this
        // one use; nothing borrows them after the setns calls above.
        unsafe { libc::close(fd) };
    }
    if let Err((step, errno)) = entered {
        return Err((1, describe_entry(step, errno, &workdir)));
    }
    // SAFETY: restores the default action of one signal before exec; no
    // handler is involved.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // SAFETY: program and argv are valid NUL-terminated strings, argv ends
    // with a null pointer; execvp returns only on failure.
    unsafe { libc::execvp(program.as_ptr(), argv.as_ptr()) };
    let errno = Errno::last();
    let name = command[0].to_string_lossy();
    let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.to_string());
    Err(if errno == Errno::ENOENT && !name.contains('/') {
        (
            127,
            format!("command '{name}' not found in the container (PATH={path})"),
        )
    } else {
        (
            126,
            format!("cannot run '{name}' in the container: {errno}"),
        )
    })
}

/// The message for a failed step of entering by `__enter`.
fn describe_entry(step: Step, errno: Errno, workdir: &str) -> String {
    match step {
        Step::UserNamespace => format!(
            "cannot join the container's user namespace (setns): {errno}; the task must run as \
             the user the container was built for"
        ),
        Step::Workdir => format!(
            "cannot change to the working directory {workdir} in the container: {errno}; does \
             it exist in the image? Choose another with --container-workdir"
        ),
        Step::Seccomp => format!(
            "cannot install the seccomp filter of --container-remap-root: {errno}; run without \
             --container-remap-root"
        ),
        other => format!("cannot enter the container ({other:?}): {errno}"),
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if std::process::id() == self.owner_pid && !self.daemons.is_empty() {
            fuse::stop_all(&self.daemons);
        }
    }
}

/// The paths to try for `program`: itself when it has a `/`, else each `PATH`
/// entry joined with it (an empty entry is the working directory).
fn executable_candidates(program: &str, path: &str) -> Vec<String> {
    if program.contains('/') {
        return vec![program.to_string()];
    }
    path.split(':')
        .map(|dir| {
            if dir.is_empty() {
                program.to_string()
            } else {
                format!("{}/{program}", dir.trim_end_matches('/'))
            }
        })
        .collect()
}

/// Everything the child of [`Container::run`] needs, built before fork so the
/// child does not allocate.
struct PreparedCommand {
    /// Owns the strings `argv` points into.
    _args: Vec<CString>,
    /// Owns the strings `envp` points into.
    _env: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    candidates: Vec<CString>,
    path: String,
    workdir: CString,
    switch_to_user: bool,
    groups: Vec<libc::gid_t>,
}

impl PreparedCommand {
    fn new(
        container: &Container,
        argv: &[String],
        env: &[(String, String)],
    ) -> anyhow::Result<PreparedCommand> {
        let Some(program) = argv.first() else {
            bail!("no command given to run in the container");
        };
        let path = env
            .iter()
            .find(|(name, _)| name == "PATH")
            .map_or(DEFAULT_PATH, |(_, value)| value.as_str())
            .to_string();
        let args =
            to_cstrings(argv.iter().map(String::as_bytes)).context("bad command argument")?;
        let env = to_cstrings(env.iter().map(|(k, v)| format!("{k}={v}").into_bytes()))
            .context("bad environment variable")?;
        Ok(PreparedCommand {
            // The pointers stay valid when the CStrings move: their bytes are
            // on the heap.
            argv: null_terminated(&args),
            envp: null_terminated(&env),
            _args: args,
            _env: env,
            candidates: to_cstrings(executable_candidates(program, &path))
                .context("bad command name")?,
            path,
            workdir: CString::new(container.workdir.as_bytes()).context("bad working directory")?,
            switch_to_user: nix::unistd::geteuid().is_root() && container.user.uid != 0,
            groups: container.user.all_gids(),
        })
    }

    /// execve each candidate in turn; returns the error to report when none
    /// ran (EACCES if some candidate existed but was not executable, like
    /// execvp).
    fn exec(&self) -> Errno {
        let mut result = Errno::ENOENT;
        for candidate in &self.candidates {
            // SAFETY: a NUL-terminated path and two null-terminated arrays of
            // pointers to NUL-terminated strings, all owned by `self`.
            unsafe { libc::execve(candidate.as_ptr(), self.argv.as_ptr(), self.envp.as_ptr()) };
            match Errno::last() {
                Errno::ENOENT | Errno::ENOTDIR => {}
                Errno::EACCES => result = Errno::EACCES,
                other => return other,
            }
        }
        result
    }
}

fn to_cstrings<I, B>(items: I) -> anyhow::Result<Vec<CString>>
where
    I: IntoIterator<Item = B>,
    B: Into<Vec<u8>>,
{
    items
        .into_iter()
        .map(|item| {
            let bytes = item.into();
            CString::new(bytes).map_err(|err| {
                anyhow::anyhow!(
                    "{:?} contains a NUL byte",
                    std::ffi::OsStr::from_bytes(&err.into_vec())
                )
            })
        })
        .collect()
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

fn errno_of(err: &std::io::Error) -> Errno {
    Errno::from_raw(err.raw_os_error().unwrap_or(libc::EIO))
}

fn wait_for(pid: i32) -> anyhow::Result<ExitStatus> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child with a valid status pointer.
        let ret = unsafe { libc::waitpid(pid, &mut status, 0) };
        if ret == pid {
            return Ok(ExitStatus::from_raw(status));
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err).context("cannot wait for the command");
        }
    }
}

/// The child SIGINT and SIGTERM are forwarded to (0: none yet).
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward_signal(signal: libc::c_int) {
    let pid = FORWARD_TO.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, signal) };
    }
}

/// SIGINT and SIGTERM handlers that forward to the running child, restored
/// to the previous ones when dropped.
struct SignalForwarding {
    previous: Vec<(Signal, SigAction)>,
}

impl SignalForwarding {
    fn install() -> anyhow::Result<SignalForwarding> {
        FORWARD_TO.store(0, Ordering::SeqCst);
        let action = SigAction::new(
            SigHandler::Handler(forward_signal),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        let mut previous = Vec::new();
        for signal in [Signal::SIGINT, Signal::SIGTERM] {
            // SAFETY: the handler only reads an atomic and calls kill.
            let old = unsafe { sigaction(signal, &action) }
                .with_context(|| format!("cannot install a {signal} handler"))?;
            previous.push((signal, old));
        }
        Ok(SignalForwarding { previous })
    }

    fn forward_to(&self, pid: i32) {
        FORWARD_TO.store(pid, Ordering::SeqCst);
    }
}

impl Drop for SignalForwarding {
    fn drop(&mut self) {
        FORWARD_TO.store(0, Ordering::SeqCst);
        for (signal, old) in &self.previous {
            // SAFETY: restores the handler that was installed before.
            let _ = unsafe { sigaction(*signal, old) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_path() {
        assert_eq!(
            executable_candidates("id", "/usr/bin:/bin/:"),
            vec!["/usr/bin/id", "/bin/id", "id"]
        );
        assert_eq!(executable_candidates("./x", "/bin"), vec!["./x"]);
        assert_eq!(executable_candidates("/bin/sh", "/x"), vec!["/bin/sh"]);
    }

    #[test]
    fn steps_round_trip_through_codes() {
        for code in 1..=9 {
            assert_eq!(Step::from_code(code).unwrap() as u8, code);
        }
        assert_eq!(Step::from_code(0), None);
    }
}
