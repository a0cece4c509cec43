//! Writing the flattened tar stream into a squashfs file, published
//! atomically: by berth's own streaming writer ([`super::sqfs`]; zstd only),
//! or by `tar2sqfs` (squashfs-tools-ng) through a pipe.
//!
//! berth's writer keeps about 70 bytes a file plus its name where tar2sqfs
//! keeps about 355 (300,000 files of 1 to 4 KB: 38 MiB peak against 106 MB,
//! and 2.7 to 4.1 s against 8.3 to 12.6 s on 2 cores), and needs no
//! process, no pipe and no second parse of the tar stream's headers by
//! another program.
//!
//! Compressor: zstd at level 3. On a 2-core machine and a 204 MB Debian root
//! file system tar2sqfs took 1.7 s with zstd level 3 (94 MB image), 1.0 s with
//! level 1 (96 MB), 0.7 s with lz4 (116 MB), 3.8 s with gzip level 1 (98 MB),
//! and 28.5 s with zstd at its default level 15 (87 MB). The kernel and
//! squashfuse both read zstd images.

use std::fs::{self, File};
use std::io::{BufWriter, ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::chunks::{self, ChunkReader, ChunkWriter};
use super::flatten::write_flattened;
use super::layer::Layer;
use super::sqfs::{self, WriterOptions};

/// The program that builds squashfs images.
pub const TAR2SQFS: &str = "tar2sqfs";

/// Which program writes the squashfs file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SquashfsWriter {
    /// berth's own streaming writer (zstd only; another compressor falls
    /// back to tar2sqfs).
    #[default]
    Builtin,
    /// tar2sqfs (squashfs-tools-ng).
    Tar2sqfs,
}

/// How to build the squashfs file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SquashfsOptions {
    /// Which program writes it.
    pub writer: SquashfsWriter,
    /// tar2sqfs compressor name (`zstd`, `lz4`, `gzip`, `xz`).
    pub compressor: String,
    /// tar2sqfs `-X` options, e.g. `level=3`.
    pub compressor_options: Option<String>,
    /// Compression threads of tar2sqfs.
    pub jobs: usize,
    /// Most bytes the flattened tar stream may have (file data and headers):
    /// a decompression bomb stops here with an error instead of burning CPU
    /// and disk.
    pub max_bytes: u64,
}

/// zstd level of registry pulls unless the site sets `squashfs_level`: about
/// 20% smaller files than level 1 (text-like data), for about 15% more
/// conversion time on 2 cores (bench/pull.sh).
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;

/// Default [`SquashfsOptions::max_bytes`]: 256 GiB, several times the
/// largest images in use (AI framework images are tens of GB).
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 256 << 30;

impl Default for SquashfsOptions {
    fn default() -> Self {
        SquashfsOptions {
            writer: SquashfsWriter::default(),
            compressor: "zstd".to_string(),
            compressor_options: Some(format!("level={DEFAULT_ZSTD_LEVEL}")),
            jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
            max_bytes: DEFAULT_MAX_IMAGE_BYTES,
        }
    }
}

/// What a conversion did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConvertStats {
    /// Paths in the final tree.
    pub paths: usize,
    /// Tar entries written to the squashfs writer.
    pub entries: u64,
    /// File content bytes written to the squashfs writer.
    pub bytes: u64,
    /// Size of the squashfs file.
    pub image_size: u64,
    /// Entries skipped and why.
    pub warnings: Vec<String>,
    /// Layers read a second time (for hard links to replaced files).
    pub reread_layers: usize,
    /// Total time.
    pub total_time: Duration,
}

/// Whether `tar2sqfs` can be run.
pub fn tar2sqfs_available() -> bool {
    Command::new(TAR2SQFS)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Converts `layers` (lowest first) into the squashfs file `dest`: written to a
/// temporary file beside it, synced, and renamed into place only on success.
/// Each layer is read once, top layer first (see [`super::flatten`]), and
/// streams straight into the squashfs writer.
pub fn convert(layers: &[Layer], dest: &Path, options: &SquashfsOptions) -> Result<ConvertStats> {
    convert_with(layers, dest, options, |_| {})
}

/// [`convert`], calling `on_layer` with a layer's index before it is read
/// (for progress messages; the layer's opener may also wait for its download).
pub fn convert_with(
    layers: &[Layer],
    dest: &Path,
    options: &SquashfsOptions,
    on_layer: impl FnMut(usize),
) -> Result<ConvertStats> {
    let start = Instant::now();
    let tmp = temp_path(dest);
    let mut on_layer = on_layer;
    let mut flatten = |out: &mut dyn std::io::Write| {
        let limited = LimitedWriter {
            inner: out,
            left: options.max_bytes,
            limit: options.max_bytes,
        };
        write_flattened(layers, limited, &mut on_layer)
    };
    let result = match builtin_options(options) {
        Some(writer_options) => {
            run_builtin(&tmp, &writer_options, flatten).map(|(mut stats, warnings)| {
                stats.warnings.extend(warnings);
                stats
            })
        }
        None => run_tar2sqfs(&tmp, options, |stdin| flatten(stdin)),
    };
    let stats = match result {
        Ok(stats) => stats,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let publish = || -> Result<u64> {
        let file = File::open(&tmp).with_context(|| format!("cannot open {}", tmp.display()))?;
        file.sync_all()
            .with_context(|| format!("cannot sync {}", tmp.display()))?;
        let size = file.metadata()?.len();
        fs::rename(&tmp, dest)
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), dest.display()))?;
        Ok(size)
    };
    let image_size = publish().inspect_err(|_e| {
        let _ = fs::remove_file(&tmp);
    })?;
    Ok(ConvertStats {
        paths: stats.paths,
        entries: stats.entries,
        bytes: stats.bytes,
        image_size,
        reread_layers: stats.reread_layers,
        warnings: stats.warnings,
        total_time: start.elapsed(),
    })
}

/// A writer that fails once more than `limit` bytes went through it.
struct LimitedWriter<W> {
    inner: W,
    left: u64,
    limit: u64,
}

impl<W: std::io::Write> std::io::Write for LimitedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() as u64 > self.left {
            return Err(std::io::Error::other(format!(
                "the image expands to more than {} ({} bytes) of files: refused as a \
                 decompression bomb or an image too large for this node; if the image is \
                 legitimate, raise the limit (plugstack `max_image_size`, or \
                 `berth pull --max-image-size`)",
                crate::units::format_size(self.limit),
                self.limit
            )));
        }
        let n = self.inner.write(buf)?;
        self.left -= n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn temp_path(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "image.sqfs".to_string());
    dest.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}

/// Bytes the pipe into tar2sqfs holds (the kernel's default is 64 KiB): a
/// larger pipe lets berth and tar2sqfs run apart for longer, with fewer
/// wake-ups of each other.
const PIPE_BYTES: libc::c_int = 1 << 20;

/// Grows the pipe into tar2sqfs to [`PIPE_BYTES`] (an unprivileged process
/// may go up to `/proc/sys/fs/pipe-max-size`); an optimisation only.
fn widen_pipe(pipe: &std::process::ChildStdin) {
    use std::os::fd::AsRawFd;
    // SAFETY: F_SETPIPE_SZ takes an int and changes only the pipe's
    // capacity; the fd is valid while `pipe` is borrowed.
    unsafe {
        libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES);
    }
}

/// The options of berth's own writer when it writes this image: asked for,
/// and zstd (the only compressor it has).
fn builtin_options(options: &SquashfsOptions) -> Option<WriterOptions> {
    if options.writer != SquashfsWriter::Builtin || options.compressor != "zstd" {
        return None;
    }
    let mut writer = WriterOptions {
        jobs: options.jobs.max(1),
        ..WriterOptions::default()
    };
    for option in options.compressor_options.iter().flat_map(|o| o.split(',')) {
        match option.split_once('=') {
            Some(("level", level)) => writer.zstd_level = level.trim().parse().ok()?,
            // An option only tar2sqfs knows: let tar2sqfs write the image.
            _ => return None,
        }
    }
    Some(writer)
}

/// Runs berth's own writer into `out` on a thread of its own, feeding it
/// the tar stream through `feed` on this one. Returns what `feed` returned
/// and the writer's warnings (what it skipped, and why).
fn run_builtin<T>(
    out: &Path,
    options: &WriterOptions,
    feed: impl FnOnce(&mut dyn std::io::Write) -> Result<T>,
) -> Result<(T, Vec<String>)> {
    // As tar2sqfs -f: a file a dead run of the same pid left is replaced;
    // never through a link.
    let file = File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(out)
        .with_context(|| format!("cannot create {}", out.display()))?;
    let _writeback = super::writeback::Watcher::start(out);
    let (tx, rx) = chunks::channel();
    std::thread::scope(|s| {
        let writer = std::thread::Builder::new()
            .name("berth-squashfs".to_string())
            .spawn_scoped(s, move || -> Result<sqfs::WriteStats> {
                let mut tar = ChunkReader::new(rx, "the flattened tar stream stopped unexpectedly");
                let written = sqfs::write_from_tar(&mut tar, file, options)?;
                // The writer stops at the tar's end-of-archive blocks: read on
                // to the stream's end, so the flattener never finds the channel
                // closed after a success (padding after those blocks is fine).
                std::io::copy(&mut tar, &mut std::io::sink())?;
                Ok(written)
            })
            .context("cannot start the squashfs writer's thread")?;
        let mut stream = ChunkWriter::new(tx);
        let fed = feed(&mut stream).and_then(|v| {
            stream.finish()?;
            Ok(v)
        });
        // Dropped unfinished on an error: the writer stops with one too.
        let written = writer
            .join()
            .map_err(|_| anyhow!("berth's squashfs writer panicked writing {}", out.display()))?;
        match (fed, written) {
            (Ok(v), Ok(written)) => Ok((v, written.warnings)),
            (Ok(_), Err(e)) => Err(e.context(format!("cannot write {}", out.display()))),
            // The writer stopped first (the disk is full, ...): that is the cause.
            (Err(e), Err(w)) if is_broken_pipe(&e) => {
                Err(w.context(format!("cannot write {}", out.display())))
            }
            (Err(e), _) => Err(e),
        }
    })
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == ErrorKind::BrokenPipe)
    })
}

/// Runs tar2sqfs writing `out`, feeding its stdin through `feed`. tar2sqfs's
/// stderr goes into the error when it fails.
fn run_tar2sqfs<T>(
    out: &Path,
    options: &SquashfsOptions,
    feed: impl FnOnce(&mut BufWriter<std::process::ChildStdin>) -> Result<T>,
) -> Result<T> {
    let mut cmd = Command::new(TAR2SQFS);
    cmd.args(["-q", "-f", "-c", &options.compressor]);
    if let Some(x) = &options.compressor_options {
        cmd.args(["-X", x]);
    }
    cmd.args(["-j", &options.jobs.max(1).to_string()])
        .arg(out)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| {
        if e.kind() == ErrorKind::NotFound {
            anyhow!(
                "cannot run {TAR2SQFS}: it is not installed; install squashfs-tools-ng \
                 (Debian/Ubuntu: apt-get install squashfs-tools-ng)"
            )
        } else {
            anyhow!("cannot run {TAR2SQFS}: {e}")
        }
    })?;
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let stderr_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.by_ref().take(64 * 1024).read_to_string(&mut s);
        // Keep draining so tar2sqfs never blocks on a full pipe.
        let _ = std::io::copy(&mut stderr, &mut std::io::sink());
        s
    });
    let _writeback = super::writeback::Watcher::start(out);
    let stdin = child.stdin.take().expect("stdin is piped");
    widen_pipe(&stdin);
    let mut writer = BufWriter::with_capacity(1 << 20, stdin);
    let fed = feed(&mut writer).and_then(|v| {
        use std::io::Write;
        writer.flush()?;
        Ok(v)
    });
    drop(writer);
    if fed.is_err() {
        // tar2sqfs may still be waiting for input: stop it.
        let _ = child.kill();
    }
    let status = child
        .wait()
        .with_context(|| format!("cannot wait for {TAR2SQFS}"))?;
    let stderr = stderr_reader.join().unwrap_or_default();
    let stderr = stderr.trim();
    match fed {
        Ok(_) if !status.success() => bail!(
            "{TAR2SQFS} failed ({status}) writing {}: {}",
            out.display(),
            if stderr.is_empty() {
                "no message"
            } else {
                stderr
            }
        ),
        Ok(v) => {
            if !stderr.is_empty() {
                eprintln!("berth: {TAR2SQFS} warnings for {}: {stderr}", out.display());
            }
            Ok(v)
        }
        Err(e) if !stderr.is_empty() && !status.success() => Err(e.context(format!(
            "{TAR2SQFS} stopped ({status}) writing {}: {stderr}",
            out.display()
        ))),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gzip layer of 64 MiB of zeros (64 KiB compressed) against a 16 MiB
    /// limit: an error that says why, and no partial file left behind.
    #[test]
    fn decompression_bombs_stop_at_the_limit() {
        if !tar2sqfs_available()
            && crate::test_support::skip_because(
                "decompression_bombs_stop_at_the_limit",
                "no tar2sqfs (apt-get install squashfs-tools-ng)",
            )
        {
            return;
        }
        let mut tar = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(64 << 20);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, "zeros", std::io::repeat(0).take(64 << 20))
            .unwrap();
        let raw = tar.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        std::io::Write::write_all(&mut gz, &raw).unwrap();
        let bomb = gz.finish().unwrap();
        assert!(bomb.len() < 1 << 20, "{}", bomb.len());
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("image.sqfs");
        let options = SquashfsOptions {
            max_bytes: 16 << 20,
            ..SquashfsOptions::default()
        };
        let err = convert(&[Layer::from_bytes(bomb.clone(), "bomb")], &dest, &options).unwrap_err();
        assert!(format!("{err:#}").contains("decompression bomb"), "{err:#}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        // The default limit lets it through.
        convert(
            &[Layer::from_bytes(bomb, "bomb")],
            &dest,
            &SquashfsOptions::default(),
        )
        .unwrap();
    }

    /// Bytes after the tar's end-of-archive blocks (tar pads to its record
    /// size) are read and ignored: the writer is done before the stream is,
    /// and the feeding side must not see the channel closed.
    #[test]
    fn padding_after_the_end_of_the_archive_is_no_broken_pipe() {
        let mut tar = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(2);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, "file", &b"hi"[..]).unwrap();
        let tar = tar.into_inner().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("image.sqfs");
        let (fed, warnings) = run_builtin(&out, &WriterOptions::default(), |w| {
            w.write_all(&tar)?;
            // More than the channel holds: the sends would fail on a closed channel.
            w.write_all(&vec![0; 4 * chunks::PIPE_CHUNK * chunks::PIPE_CHUNKS])?;
            Ok(7)
        })
        .unwrap();
        assert_eq!((fed, warnings.len()), (7, 0));
        assert!(fs::metadata(&out).unwrap().len() > 0);
    }

    /// What berth's writer skips reaches the conversion's warnings (which
    /// a pull prints), as the flattener's do.
    #[test]
    fn the_writer_s_warnings_reach_the_conversion() {
        let mut tar = tar::Builder::new(Vec::new());
        tar.append_pax_extensions([("SCHILY.xattr.system.posix_acl_access", &b"acl"[..])])
            .unwrap();
        let mut header = tar::Header::new_gnu();
        header.set_size(2);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, "file", &b"hi"[..]).unwrap();
        let layer = Layer::from_bytes(tar.into_inner().unwrap(), "acl");
        let dir = tempfile::tempdir().unwrap();
        let stats = convert(
            &[layer],
            &dir.path().join("image.sqfs"),
            &SquashfsOptions::default(),
        )
        .unwrap();
        assert!(
            stats
                .warnings
                .iter()
                .any(|w| w.contains("system.posix_acl_access")),
            "{:?}",
            stats.warnings
        );
    }

    /// Measures a conversion of real layers:
    /// `BERTH_BENCH_LAYERS=a.tar.gz:b.tar.gz cargo test --release --lib bench_convert -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn bench_convert() {
        let Ok(list) = std::env::var("BERTH_BENCH_LAYERS") else {
            eprintln!("set BERTH_BENCH_LAYERS to a ':'-separated list of layer blobs");
            return;
        };
        let layers: Vec<Layer> = list
            .split(':')
            .map(|p| Layer::from_file(PathBuf::from(p), p.to_string()))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let dest = std::env::var_os("BERTH_BENCH_OUT")
            .map(PathBuf::from)
            .unwrap_or_else(|| dir.path().join("image.sqfs"));
        let stats = convert(&layers, &dest, &SquashfsOptions::default()).unwrap();
        let mb = stats.bytes as f64 / 1e6;
        eprintln!(
            "{} paths, {:.1} MB of file data -> {:.1} MB squashfs; {} layers read twice, total {:.2?} ({:.0} MB/s)",
            stats.paths,
            mb,
            stats.image_size as f64 / 1e6,
            stats.reread_layers,
            stats.total_time,
            mb / stats.total_time.as_secs_f64()
        );
        for w in &stats.warnings {
            eprintln!("warning: {w}");
        }
    }
}
