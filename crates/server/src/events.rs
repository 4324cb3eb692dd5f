//! The live view's feed: what the engine does, sampled twice a second and streamed to the
//! page as server-sent events at `GET /v1/strata/events`.
//!
//! [`RoutingCounts`] is installed on the model as its [`RoutingTap`]: every MoE layer of
//! every forward pass adds its routed `(token, expert)` pairs to relaxed atomic counters,
//! nothing more. A sampler task ([`start`]) reads them with the server's counters, the
//! scheduler's queue and the hybrid executor's metrics (when `--device hybrid` gave the
//! server some), turns them into one [`Frame`] per tick, keeps the last minutes of
//! throughput, and publishes the frame's JSON on a watch channel that every open stream
//! reads. The stream opens with a `hello` event (the model's layout and the history so far,
//! so a reloaded or reconnected page draws the last minutes at once), then one `tick` event
//! per frame.
//!
//! A key design decision made here is that the forward pass only counts and the sampler
//! does everything else: the scheduler thread never takes a lock or allocates for the
//! live view, the heat of "recent tokens" is the difference of two counter snapshots, and
//! one frame is serialised once however many pages watch.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Serialize;
use strata_model::config::FfnConfig;
use strata_model::{ModelConfig, Routing, RoutingTap};
use tokio::sync::watch;

use crate::AppState;

/// Time between two frames.
pub const TICK: Duration = Duration::from_millis(500);
/// Frames whose routing makes up the heat map: the last 5 seconds.
pub const HEAT_TICKS: usize = 10;
/// Samples of throughput and queue depth kept: the last 5 minutes.
pub const HISTORY: usize = 600;
/// How long a disconnected page waits before it reconnects, in milliseconds.
const RETRY_MS: u64 = 1000;

/// Routed `(token, expert)` pairs per MoE layer and expert since the start, counted by the
/// forward pass.
#[derive(Debug)]
pub struct RoutingCounts {
    /// Decoder layer index of each MoE layer.
    layers: Vec<usize>,
    /// Row in `counts` of each decoder layer (`None`: a dense layer).
    row: Vec<Option<usize>>,
    experts: usize,
    /// `[moe layer, expert]`.
    counts: Box<[AtomicU64]>,
}

impl RoutingCounts {
    /// Counters for the MoE layers of a model configured as `config`.
    pub fn new(config: &ModelConfig) -> RoutingCounts {
        let experts = config.layers.iter().map(|f| match f {
            FfnConfig::Moe(m) => Some(m.router.n_experts),
            FfnConfig::Dense(_) => None,
        });
        RoutingCounts::with_layout(experts)
    }

    /// Counters for decoder layers with these routed experts (`None`: a dense layer); every
    /// MoE layer gets as many counters as the largest.
    fn with_layout(experts_of_layer: impl Iterator<Item = Option<usize>>) -> RoutingCounts {
        let mut layers = Vec::new();
        let mut row = Vec::new();
        let mut experts = 0;
        for (i, e) in experts_of_layer.enumerate() {
            row.push(e.map(|_| layers.len()));
            if let Some(e) = e {
                layers.push(i);
                experts = experts.max(e);
            }
        }
        let counts = (0..layers.len() * experts)
            .map(|_| AtomicU64::new(0))
            .collect();
        RoutingCounts {
            layers,
            row,
            experts,
            counts,
        }
    }

    /// Decoder layer index of each MoE layer.
    pub fn layers(&self) -> &[usize] {
        &self.layers
    }

    /// Routed experts per MoE layer.
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// The counters now, `[moe layer, expert]`.
    pub fn snapshot(&self) -> Vec<u64> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

impl RoutingTap for RoutingCounts {
    fn on_routing(&self, layer: usize, routing: &Routing) {
        let Some(&Some(row)) = self.row.get(layer) else {
            return;
        };
        let counts = &self.counts[row * self.experts..(row + 1) * self.experts];
        for &e in &routing.ids {
            // An id out of range would be the router's bug; the live view skips it.
            if let Some(c) = counts.get(e as usize) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// One point of the throughput history.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Sample {
    /// Unix time, milliseconds.
    pub t: u64,
    /// Tokens generated per second since the previous sample.
    pub gen_tps: f64,
    /// Prompt tokens accepted per second since the previous sample.
    pub prompt_tps: f64,
    /// Requests waiting for a place in the batch.
    pub queued: usize,
    /// Sequences in the running batch.
    pub active: usize,
}

/// What a `tick` event carries.
#[derive(Debug, Clone, Serialize)]
pub struct Frame {
    /// The newest sample.
    pub sample: Sample,
    /// Generation requests received since the start.
    pub requests: u64,
    /// Requests answered with an error status since the start.
    pub errors: u64,
    /// Tokens generated since the start.
    pub generated: u64,
    /// Routed pairs per MoE layer and expert over the last [`HEAT_TICKS`] frames,
    /// `heat[layer][expert]`.
    pub heat: Vec<Vec<u64>>,
    /// Tokens routed through each MoE layer over the same frames.
    pub heat_tokens: Vec<u64>,
    /// The hybrid executor's counters as `/metrics` renders them (`name{labels}` to
    /// value), when the server has them.
    pub hybrid: Option<Vec<(String, f64)>>,
    /// The experts held on the accelerator, `resident[moe layer]`, when the server has an
    /// accelerator's expert cache.
    pub resident: Option<Vec<Vec<u32>>>,
}

/// The live view's state, one per [`AppState`].
#[derive(Debug)]
pub struct Live {
    counts: Arc<RoutingCounts>,
    top_k: usize,
    history: Mutex<VecDeque<Sample>>,
    frames: watch::Sender<Feed>,
    started: AtomicBool,
}

/// What the watch channel holds.
#[derive(Debug, Clone)]
enum Feed {
    /// No frame yet.
    Empty,
    /// The newest frame's JSON.
    Frame(Arc<str>),
    /// The server is shutting down: streams end.
    Closed,
}

impl Live {
    /// The live view of a model configured as `config`; install [`Live::tap`] on the
    /// model for the heat map.
    pub fn new(config: &ModelConfig) -> Live {
        let top_k = config
            .layers
            .iter()
            .find_map(|f| match f {
                FfnConfig::Moe(m) => Some(m.router.top_k),
                FfnConfig::Dense(_) => None,
            })
            .unwrap_or(0);
        Live {
            counts: Arc::new(RoutingCounts::new(config)),
            top_k,
            history: Mutex::new(VecDeque::with_capacity(HISTORY)),
            frames: watch::Sender::new(Feed::Empty),
            started: AtomicBool::new(false),
        }
    }

    /// The routing counters, for [`strata_model::Model::set_routing_tap`].
    pub fn tap(&self) -> Arc<dyn RoutingTap> {
        Arc::clone(&self.counts) as Arc<dyn RoutingTap>
    }

    /// Ends every open stream and the sampler: the server is shutting down, and its
    /// graceful shutdown waits for every response to end.
    pub fn close(&self) {
        self.frames.send_replace(Feed::Closed);
    }

    /// The `hello` event's payload: the layout and the history so far.
    fn hello(&self, model: &str) -> serde_json::Value {
        let history: Vec<Sample> = lock(&self.history).iter().copied().collect();
        serde_json::json!({
            "model": model,
            "layers": self.counts.layers(),
            "experts": self.counts.experts(),
            "top_k": self.top_k,
            "tick_ms": TICK.as_millis() as u64,
            "heat_seconds": (TICK * HEAT_TICKS as u32).as_secs_f64(),
            "history": history,
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The sampler's memory between ticks.
struct Sampler {
    last: Instant,
    counts: Vec<u64>,
    generated: u64,
    prompt: u64,
    /// Per-tick routing deltas, newest last.
    recent: VecDeque<Vec<u64>>,
}

impl Sampler {
    fn new(st: &AppState) -> Sampler {
        let (generated, prompt) = token_counters(st);
        Sampler {
            last: Instant::now(),
            counts: st.live.counts.snapshot(),
            generated,
            prompt,
            recent: VecDeque::with_capacity(HEAT_TICKS),
        }
    }

    /// Reads everything once and makes the next frame.
    fn tick(&mut self, st: &AppState) -> Frame {
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64().max(1e-3);
        self.last = now;
        let counts = st.live.counts.snapshot();
        let delta = counts
            .iter()
            .zip(&self.counts)
            .map(|(n, o)| n.saturating_sub(*o))
            .collect();
        self.counts = counts;
        if self.recent.len() == HEAT_TICKS {
            self.recent.pop_front();
        }
        self.recent.push_back(delta);
        let (heat, heat_tokens) = heat(&self.recent, st.live.counts.experts(), st.live.top_k);
        let (generated, prompt) = token_counters(st);
        let sample = Sample {
            t: unix_ms(),
            gen_tps: generated.saturating_sub(self.generated) as f64 / dt,
            prompt_tps: prompt.saturating_sub(self.prompt) as f64 / dt,
            queued: st.scheduler.queued(),
            active: st.scheduler.active(),
        };
        (self.generated, self.prompt) = (generated, prompt);
        let m = &st.metrics;
        let extra = st.extra_metrics.as_ref().map(|x| x.snapshot());
        Frame {
            sample,
            requests: m.chat_requests.load(Ordering::Relaxed)
                + m.completion_requests.load(Ordering::Relaxed),
            errors: m.errors.load(Ordering::Relaxed),
            generated,
            heat,
            heat_tokens,
            hybrid: extra.as_ref().map(|(text, _)| parse_exposition(text)),
            resident: extra.and_then(|(_, resident)| resident),
        }
    }
}

/// Tokens generated (the scheduler's count, cancelled sequences included) and prompt
/// tokens accepted.
fn token_counters(st: &AppState) -> (u64, u64) {
    (
        st.scheduler.generated_tokens(),
        st.metrics.prompt_tokens.load(Ordering::Relaxed),
    )
}

/// Sums per-tick routing deltas (`[moe layer, expert]` each) into `heat[layer][expert]`
/// and the tokens routed per layer (pairs over `top_k`).
pub fn heat(
    recent: &VecDeque<Vec<u64>>,
    experts: usize,
    top_k: usize,
) -> (Vec<Vec<u64>>, Vec<u64>) {
    let Some(first) = recent.front() else {
        return (Vec::new(), Vec::new());
    };
    let mut sum = vec![0u64; first.len()];
    for d in recent {
        for (s, v) in sum.iter_mut().zip(d) {
            *s += v;
        }
    }
    let heat: Vec<Vec<u64>> = sum.chunks(experts.max(1)).map(<[u64]>::to_vec).collect();
    let tokens = heat
        .iter()
        .map(|row| row.iter().sum::<u64>() / top_k.max(1) as u64)
        .collect();
    (heat, tokens)
}

/// The sample lines of a Prometheus text exposition: `(name{labels}, value)`; comments,
/// blank lines and lines whose value does not parse are left out.
pub fn parse_exposition(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.trim().rsplit_once(' ')?;
            Some((key.trim().to_string(), value.parse().ok()?))
        })
        .collect()
}

/// Starts `st`'s sampler once; it stops when the state is dropped or the runtime ends.
/// Must be called within a tokio runtime.
pub fn start(st: &Arc<AppState>) {
    if st.live.started.swap(true, Ordering::AcqRel) {
        return;
    }
    st.engine.model.set_routing_tap(Some(st.live.tap()));
    let weak: Weak<AppState> = Arc::downgrade(st);
    let mut sampler = Sampler::new(st);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(TICK);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        every.tick().await;
        loop {
            every.tick().await;
            let Some(st) = weak.upgrade() else { break };
            if matches!(*st.live.frames.borrow(), Feed::Closed) {
                break;
            }
            let frame = sampler.tick(&st);
            {
                let mut h = lock(&st.live.history);
                if h.len() == HISTORY {
                    h.pop_front();
                }
                h.push_back(frame.sample);
            }
            match serde_json::to_string(&frame) {
                Ok(json) => {
                    st.live.frames.send_if_modified(|f| {
                        // A close between the check above and here stays closed.
                        let open = !matches!(f, Feed::Closed);
                        if open {
                            *f = Feed::Frame(json.into());
                        }
                        open
                    });
                }
                Err(e) => tracing::error!(error = %e, "live view frame not serialised"),
            }
        }
    });
}

/// `GET /v1/strata/events`: a `hello` event, then a `tick` event per frame, until the
/// client leaves or the server stops.
pub async fn stream(State(st): State<Arc<AppState>>) -> Response {
    start(&st);
    let hello = Event::default()
        .event("hello")
        .retry(Duration::from_millis(RETRY_MS))
        .data(st.live.hello(&st.model_id).to_string());
    let mut rx = st.live.frames.subscribe();
    // The newest frame is already waiting: the page draws it at once.
    rx.mark_changed();
    // The stream keeps only the channel: [`Live::close`] or the state's end closes it.
    drop(st);
    let ticks = futures_util::stream::unfold(rx, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            let feed = rx.borrow_and_update().clone();
            match feed {
                Feed::Empty => {}
                Feed::Frame(json) => {
                    return Some((Event::default().event("tick").data(&*json), rx));
                }
                Feed::Closed => return None,
            }
        }
    });
    let events = futures_util::stream::once(async { hello })
        .chain(ticks)
        .map(Ok::<_, Infallible>);
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routing(top_k: usize, ids: &[u32]) -> Routing {
        Routing {
            top_k,
            ids: ids.to_vec(),
            weights: vec![0.5; ids.len()],
            candidates: None,
        }
    }

    #[test]
    fn routing_counts_count_pairs_of_moe_layers_only() {
        // Layer 0 dense, layers 1 and 2 with 4 experts.
        let c = RoutingCounts::with_layout([None, Some(4), Some(4)].into_iter());
        assert_eq!(c.layers(), &[1, 2]);
        assert_eq!(c.experts(), 4);
        c.on_routing(1, &routing(2, &[0, 3, 3, 1]));
        c.on_routing(2, &routing(2, &[2, 1]));
        c.on_routing(2, &routing(2, &[2, 0]));
        // A dense layer, a layer past the end and an expert id out of range are skipped.
        c.on_routing(0, &routing(2, &[0, 1]));
        c.on_routing(7, &routing(2, &[0, 1]));
        c.on_routing(1, &routing(2, &[4, 99]));
        assert_eq!(c.snapshot(), vec![1, 1, 0, 2, 1, 1, 2, 0]);
    }

    #[test]
    fn routing_counts_of_a_model_without_experts_are_empty() {
        let c = RoutingCounts::with_layout([None, None].into_iter());
        assert!(c.layers().is_empty());
        c.on_routing(0, &routing(1, &[0]));
        assert!(c.snapshot().is_empty());
    }

    #[test]
    fn heat_sums_the_recent_ticks_per_layer() {
        // Two layers of three experts, top 2: two ticks of deltas.
        let recent = VecDeque::from([vec![1, 1, 0, 0, 2, 0], vec![0, 1, 1, 1, 0, 1]]);
        let (sum, tokens) = heat(&recent, 3, 2);
        assert_eq!(sum, vec![vec![1, 2, 1], vec![1, 2, 1]]);
        assert_eq!(tokens, vec![2, 2]);
        let (sum, tokens) = heat(&VecDeque::new(), 3, 2);
        assert!(sum.is_empty() && tokens.is_empty());
    }

    #[test]
    fn exposition_lines_parse_into_names_and_values() {
        let text = "# HELP x_total X.\n# TYPE x_total counter\nx_total{device=\"gpu\"} 1.5\n\
                    y 3\n\nbroken line\nz NaN-ish\n";
        assert_eq!(
            parse_exposition(text),
            vec![
                ("x_total{device=\"gpu\"}".to_string(), 1.5),
                ("y".into(), 3.0)
            ]
        );
    }
}
