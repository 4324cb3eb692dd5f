//! Progress of long work (loading, `convert`, `trace`, `stratify`, `batch`), on stderr only.
//!
//! On a terminal it is an `indicatif` bar with rate and time left, cleared when the work
//! ends; otherwise a plain line per step, at most one a second plus the first and the
//! last, so CI logs stay readable. A key design decision: stdout is never written here, so
//! `strata generate ... | cat` carries only the generated text.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressState, ProgressStyle};

/// Least time between two plain lines.
const PLAIN_EVERY: Duration = Duration::from_secs(1);

/// One piece of long work: `total` steps of `unit`.
#[derive(Debug)]
pub struct Progress {
    what: String,
    unit: &'static str,
    total: u64,
    started: Instant,
    /// The bar, on a terminal, cleared when dropped (the command prints its own summary);
    /// `None` writes plain lines.
    bar: Option<ProgressBar>,
    /// When the last plain line was written.
    last_line: Option<Instant>,
}

impl Progress {
    /// Starts reporting `what` (`loading model.gguf`), `total` steps of `unit` (`layers`).
    pub fn new(what: impl Into<String>, total: u64, unit: &'static str) -> Progress {
        let what = what.into();
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
                .with_finish(ProgressFinish::AndClear);
            // The bar takes the width the rest leaves, so the line never wraps.
            let style = ProgressStyle::with_template(
                "{msg} [{wide_bar}] {pos}/{len} {prefix} ({rate}, {eta} left)",
            )
            .expect("the template is valid")
            .with_key("rate", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.1}/s", s.per_sec());
            })
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_prefix(unit);
            bar.set_message(what.clone());
            bar
        });
        Progress {
            what,
            unit,
            total,
            started: Instant::now(),
            bar,
            last_line: None,
        }
    }

    /// `done` of the steps are finished; `note` (failures, tokens/s) follows the count.
    pub fn set(&mut self, done: u64, note: &str) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            if !note.is_empty() {
                bar.set_message(format!("{} {note}", self.what));
            }
            return;
        }
        let now = Instant::now();
        let due = self
            .last_line
            .is_none_or(|t| now.duration_since(t) >= PLAIN_EVERY);
        if !due && done < self.total {
            return;
        }
        self.last_line = Some(now);
        let secs = self.started.elapsed().as_secs_f64();
        let rate = done as f64 / secs.max(1e-9);
        let left = if done >= self.total {
            format!("done in {secs:.1} s")
        } else if done == 0 {
            format!("{secs:.1} s elapsed")
        } else {
            format!("~{:.0} s left", (self.total - done) as f64 / rate)
        };
        let note = if note.is_empty() {
            String::new()
        } else {
            format!(", {note}")
        };
        eprintln!(
            "{}: {done}/{} {} ({rate:.1}/s, {left}){note}",
            self.what, self.total, self.unit
        );
    }
}
