//! What a pull tells the person waiting for it: per-layer bars redrawn in
//! place on a terminal, plain lines otherwise (a line per layer done and a
//! summary every [`LINE_INTERVAL`]), or nothing.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often plain-line mode prints a summary while layers download.
pub const LINE_INTERVAL: Duration = Duration::from_secs(5);
/// How often bars are redrawn.
const BAR_INTERVAL: Duration = Duration::from_millis(200);
/// Width of a bar in characters.
const BAR_WIDTH: usize = 30;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgressMode {
    /// Nothing (machine-read output, `--json`).
    #[default]
    Off,
    /// Plain lines on stderr (not a terminal, logs, srun).
    Lines,
    /// Per-layer bars redrawn in place on stderr (a terminal).
    Bars,
}

impl ProgressMode {
    /// Bars when stderr is a terminal, else lines.
    pub fn auto() -> ProgressMode {
        if std::io::stderr().is_terminal() {
            ProgressMode::Bars
        } else {
            ProgressMode::Lines
        }
    }
}

/// A layer's state.
mod state {
    pub const WAITING: u8 = 0;
    pub const DOWNLOADING: u8 = 1;
    pub const STORED: u8 = 2;
    pub const FETCHED: u8 = 3;
    pub const CONVERTING: u8 = 4;
    pub const CONVERTED: u8 = 5;
}

/// One layer's counters, updated by its download thread.
#[derive(Debug)]
pub struct LayerProgress {
    name: String,
    size: u64,
    done: AtomicU64,
    state: AtomicU8,
    /// Downloaded and verified, or found in the store (a layer is converted
    /// while it downloads: its state alone does not say).
    complete: AtomicBool,
}

impl LayerProgress {
    /// Adds `n` downloaded bytes.
    pub fn add(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }

    /// Starts the download again from zero (a broken connection).
    pub fn restart(&self) {
        self.done.store(0, Ordering::Relaxed);
    }
}

/// Progress of one pull, shared by its threads.
#[derive(Debug)]
pub struct Progress {
    mode: ProgressMode,
    layers: Vec<LayerProgress>,
    started: Instant,
    /// Lines of bars drawn last time (to move the cursor back over them).
    drawn: Mutex<usize>,
    /// When plain-line mode printed its last summary.
    last_line: Mutex<Instant>,
}

/// A short digest for messages: `sha256:0123456789ab`.
pub fn short(digest: &str) -> &str {
    let end = digest.find(':').map_or(12, |i| i + 13).min(digest.len());
    &digest[..end]
}

/// `12.3 MB`.
pub fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

impl Progress {
    /// Progress in `mode`, with no layers yet.
    pub fn new(mode: ProgressMode) -> Progress {
        Progress {
            mode,
            layers: Vec::new(),
            started: Instant::now(),
            drawn: Mutex::new(0),
            last_line: Mutex::new(Instant::now()),
        }
    }

    /// Progress of the layers `(digest, size)`, lowest first.
    pub fn with_layers(mode: ProgressMode, layers: &[(String, u64)]) -> Progress {
        let mut p = Progress::new(mode);
        p.layers = layers
            .iter()
            .map(|(name, size)| LayerProgress {
                name: short(name).to_string(),
                size: *size,
                done: AtomicU64::new(0),
                state: AtomicU8::new(state::WAITING),
                complete: AtomicBool::new(false),
            })
            .collect();
        p
    }

    /// The counters of layer `i`.
    pub fn layer(&self, i: usize) -> &LayerProgress {
        &self.layers[i]
    }

    /// Whether anything is shown.
    pub fn on(&self) -> bool {
        self.mode != ProgressMode::Off
    }

    /// A message line (between bars' redraws on a terminal).
    pub fn say(&self, msg: impl AsRef<str>) {
        match self.mode {
            ProgressMode::Off => {}
            ProgressMode::Lines => eprintln!("berth: {}", msg.as_ref()),
            ProgressMode::Bars => {
                let mut drawn = self.drawn.lock().unwrap_or_else(|e| e.into_inner());
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "{}", clear_lines(*drawn));
                let _ = writeln!(err, "berth: {}", msg.as_ref());
                *drawn = 0;
            }
        }
    }

    /// Layer `i` is downloading.
    pub fn downloading(&self, i: usize) {
        self.layers[i]
            .state
            .store(state::DOWNLOADING, Ordering::Relaxed);
    }

    /// Layer `i` was already in the store.
    pub fn stored(&self, i: usize) {
        let l = &self.layers[i];
        l.state.fetch_max(state::STORED, Ordering::Relaxed);
        l.complete.store(true, Ordering::Relaxed);
        l.done.store(l.size, Ordering::Relaxed);
        if self.mode == ProgressMode::Lines {
            self.say(format!(
                "layer {} ({}) already in the store",
                l.name,
                mb(l.size)
            ));
        }
    }

    /// Layer `i` is downloaded and verified.
    pub fn fetched(&self, i: usize) {
        let l = &self.layers[i];
        // A layer converted while it downloaded stays "converting".
        l.state.fetch_max(state::FETCHED, Ordering::Relaxed);
        l.complete.store(true, Ordering::Relaxed);
        l.done.store(l.size, Ordering::Relaxed);
        if self.mode == ProgressMode::Lines {
            self.say(format!(
                "layer {} ({}) fetched in {:.1} s",
                l.name,
                mb(l.size),
                self.started.elapsed().as_secs_f64()
            ));
        }
    }

    /// Layer `i` is being converted (earlier ones are converted).
    pub fn converting(&self, i: usize) {
        for (j, l) in self.layers.iter().enumerate() {
            if j > i && l.state.load(Ordering::Relaxed) == state::CONVERTING {
                l.state.store(state::CONVERTED, Ordering::Relaxed);
            }
        }
        if let Some(l) = self.layers.get(i) {
            l.state.store(state::CONVERTING, Ordering::Relaxed);
        }
    }

    /// Redraws the bars, or prints a summary line when it is time; called
    /// periodically by [`Progress::run_ticker`].
    pub fn tick(&self, force: bool) {
        match self.mode {
            ProgressMode::Off => {}
            ProgressMode::Lines => {
                let mut last = self.last_line.lock().unwrap_or_else(|e| e.into_inner());
                if force || last.elapsed() >= LINE_INTERVAL {
                    *last = Instant::now();
                    drop(last);
                    self.say(self.summary());
                }
            }
            ProgressMode::Bars => {
                let mut drawn = self.drawn.lock().unwrap_or_else(|e| e.into_inner());
                let mut text = clear_lines(*drawn);
                for l in &self.layers {
                    text.push_str(&bar_line(l));
                    text.push('\n');
                }
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(text.as_bytes());
                let _ = err.flush();
                *drawn = self.layers.len();
            }
        }
    }

    /// `fetched 12.3 of 45.6 MB (27%), 2 of 5 layers, 3.1 s`.
    pub fn summary(&self) -> String {
        let total: u64 = self.layers.iter().map(|l| l.size).sum();
        let done: u64 = self
            .layers
            .iter()
            .map(|l| l.done.load(Ordering::Relaxed).min(l.size))
            .sum();
        let complete = self
            .layers
            .iter()
            .filter(|l| l.complete.load(Ordering::Relaxed))
            .count();
        let percent = (done * 100).checked_div(total).unwrap_or(100);
        let converting = self
            .layers
            .iter()
            .position(|l| l.state.load(Ordering::Relaxed) == state::CONVERTING);
        if let (Some(i), true) = (converting, complete == self.layers.len()) {
            return format!(
                "all {} layers fetched; converting layer {} of {}, {:.1} s",
                self.layers.len(),
                self.layers.len() - i,
                self.layers.len(),
                self.started.elapsed().as_secs_f64()
            );
        }
        format!(
            "fetched {} of {} ({percent}%), {complete} of {} layers, {:.1} s",
            mb(done).trim_end_matches(" MB"),
            mb(total),
            self.layers.len(),
            self.started.elapsed().as_secs_f64()
        )
    }

    /// Runs `work` while a thread ticks every interval; a last tick at the end.
    pub fn run_ticker<T>(self: &Arc<Self>, work: impl FnOnce() -> T) -> T {
        if self.mode == ProgressMode::Off {
            return work();
        }
        let stop = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let ticker = {
            let me = Arc::clone(self);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let every = match me.mode {
                    ProgressMode::Bars => BAR_INTERVAL,
                    _ => Duration::from_millis(500),
                };
                let (lock, cv) = &*stop;
                let mut stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
                while !*stopped {
                    let (guard, _) = cv
                        .wait_timeout(stopped, every)
                        .unwrap_or_else(|e| e.into_inner());
                    stopped = guard;
                    if !*stopped {
                        me.tick(false);
                    }
                }
            })
        };
        let result = work();
        {
            let (lock, cv) = &*stop;
            *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
            cv.notify_all();
        }
        let _ = ticker.join();
        if self.mode == ProgressMode::Bars {
            self.converting(usize::MAX);
            self.tick(true);
        }
        result
    }
}

/// ANSI: move up `n` lines and clear from there down.
fn clear_lines(n: usize) -> String {
    if n == 0 {
        String::new()
    } else {
        format!("\x1b[{n}A\r\x1b[J")
    }
}

/// `sha256:0123456789ab [#######-------]  12.3/45.6 MB downloading`.
fn bar_line(l: &LayerProgress) -> String {
    let size = l.size.max(1);
    let done = l.done.load(Ordering::Relaxed).min(l.size);
    let filled = (done as u128 * BAR_WIDTH as u128 / size as u128) as usize;
    let what = match l.state.load(Ordering::Relaxed) {
        state::WAITING => "waiting",
        state::DOWNLOADING => "downloading",
        state::STORED => "in store",
        state::FETCHED => "fetched",
        state::CONVERTING => "converting",
        _ => "done",
    };
    format!(
        "{} [{}{}] {:>7.1}/{:.1} MB {what}",
        l.name,
        "#".repeat(filled),
        "-".repeat(BAR_WIDTH - filled),
        done as f64 / 1e6,
        l.size as f64 / 1e6,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_and_summaries() {
        let p = Progress::with_layers(
            ProgressMode::Lines,
            &[
                ("sha256:0123456789abcdef".to_string(), 1_000_000),
                ("sha256:fedcba9876543210".to_string(), 3_000_000),
            ],
        );
        p.layer(1).add(1_500_000);
        p.downloading(1);
        assert_eq!(
            bar_line(p.layer(1)),
            format!(
                "sha256:fedcba987654 [{}{}]     1.5/3.0 MB downloading",
                "#".repeat(15),
                "-".repeat(15)
            )
        );
        p.stored(0);
        let s = p.summary();
        assert!(
            s.starts_with("fetched 2.5 of 4.0 MB (62%), 1 of 2 layers"),
            "{s}"
        );
        // Layer 1 converted while it still downloads: not counted as fetched.
        p.converting(1);
        let s = p.summary();
        assert!(
            s.starts_with("fetched 2.5 of 4.0 MB (62%), 1 of 2 layers"),
            "{s}"
        );
        p.layer(1).add(1_500_000);
        p.fetched(1);
        let s = p.summary();
        assert!(
            s.starts_with("all 2 layers fetched; converting layer 1 of 2"),
            "{s}"
        );
        assert_eq!(short("sha256:abc"), "sha256:abc");
        assert_eq!(clear_lines(2), "\x1b[2A\r\x1b[J");
    }
}
