//! `strata chat`: an interactive conversation, as `ollama run` has it. The conversation is
//! kept and formatted with the model's chat template, replies stream to stdout, input may
//! span lines (a line ending in `\`, or a `"""` block), and slash commands change the
//! conversation and the sampling (`/help` lists them).
//!
//! Key types: [`Session`] (the conversation, its scheduler and settings) and [`Event`]
//! (what the input and signal threads tell the main loop).
//!
//! A key design decision: replies run on the same scheduler as the server's requests, one
//! sequence at a time, with a prefix cache large enough for the whole conversation: each
//! turn runs only the tokens after the longest prefix the cache already holds, so a long
//! conversation does not prefill again from the start. Ctrl-C cancels the reply's sequence
//! between two steps; Ctrl-C at the prompt and end of input end the program.
//! Stdout carries only the model's replies; prompts, command output and errors go to
//! stderr, so `strata chat < questions.txt > answers.txt` keeps the answers apart.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use strata_runtime::engine::Engine;
use strata_runtime::sampling::SamplingParams;
use strata_runtime::scheduler::{self, GenRequest, Scheduler, SchedulerConfig};
use strata_runtime::text::ChatMessage;

use crate::generate::{finish_name, parse_max_tokens, seconds};
use crate::model_arg::{DeviceArgs, ModelArgs, SamplingArgs};

/// Arguments of `strata chat`.
#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
// The shared sampling options, with the words that tell how to change them in a chat.
#[command(mut_arg("temperature", |a| a.help("Sampling temperature; 0 = greedy (`/set temperature`)")))]
#[command(mut_arg("seed", |a| a.help("Random seed, for reproducible replies")))]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// A system message that starts the conversation (`/system` changes it).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// Most tokens per reply (`/set max_tokens`).
    #[arg(long, short = 'n', default_value_t = 512, value_parser = parse_max_tokens)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    // Last: its help headings would otherwise take in the options after it.
    #[command(flatten)]
    device: DeviceArgs,
}

const HELP: &str = "\
/set temperature X   sampling temperature (0 = greedy); also top_p, top_k, min_p,
                     repetition_penalty, seed N|none, max_tokens N; /set alone shows them
/system TEXT         set the system message (/system alone removes it)
/clear               forget the conversation (the system message stays)
/stats               the last reply's speed, the conversation's length, the settings
/bye                 leave (also Ctrl-D, or Ctrl-C at the prompt)
/help, /?            this list
A line ending in \\ continues on the next; \"\"\" starts and ends a block of lines.
Ctrl-C during a reply stops the reply.";

/// What the main loop waits for.
#[derive(Debug)]
enum Event {
    /// A line of input, without its line ending.
    Line(String),
    /// Input ended.
    Eof,
    /// Input could not be read.
    Failed(String),
    /// Ctrl-C while no reply was being written.
    Interrupt,
}

/// Shared with the Ctrl-C thread: while a reply is written, Ctrl-C stops it instead of
/// ending the program.
#[derive(Debug, Default)]
struct Interrupts {
    replying: AtomicBool,
    stop: AtomicBool,
}

/// Reads stdin line by line on its own thread, so the main loop can wait for a line and
/// for Ctrl-C at once.
fn spawn_reader(tx: Sender<Event>) {
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let event = match line {
                Ok(l) => Event::Line(l.strip_suffix('\r').unwrap_or(&l).to_owned()),
                Err(e) => Event::Failed(e.to_string()),
            };
            let failed = matches!(event, Event::Failed(_));
            if tx.send(event).is_err() || failed {
                return;
            }
        }
        let _ = tx.send(Event::Eof);
    });
}

/// Catches Ctrl-C (SIGINT) for the rest of the process: during a reply it raises `stop`,
/// otherwise it sends [`Event::Interrupt`].
fn spawn_interrupts(tx: Sender<Event>, flags: Arc<Interrupts>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the Ctrl-C handler")?;
    std::thread::spawn(move || {
        rt.block_on(async {
            while tokio::signal::ctrl_c().await.is_ok() {
                if flags.replying.load(Ordering::SeqCst) {
                    flags.stop.store(true, Ordering::SeqCst);
                } else if tx.send(Event::Interrupt).is_err() {
                    return;
                }
            }
        });
    });
    Ok(())
}

/// What opens and closes a block of lines.
const QUOTES: &str = "\"\"\"";

/// Reads one message or command: `None` when the user leaves (end of input, Ctrl-C).
/// Lines ending in `\` continue; `"""` opens a block that a line ending in `"""` closes.
fn read_message(rx: &Receiver<Event>, prompt: bool) -> anyhow::Result<Option<String>> {
    let show = |s: &str| {
        if prompt {
            eprint!("{s}");
        }
    };
    show(">>> ");
    let mut text = String::new();
    let mut block = false;
    loop {
        let line = match rx.recv() {
            Ok(Event::Line(l)) => l,
            Ok(Event::Failed(e)) => bail!("reading stdin: {e}"),
            Ok(Event::Eof | Event::Interrupt) | Err(_) => {
                if prompt {
                    eprintln!();
                }
                return Ok(None);
            }
        };
        let mut line = line.as_str();
        let opening = line.trim_start().strip_prefix(QUOTES);
        if let Some(rest) = opening.filter(|_| !block && text.is_empty()) {
            if let Some(one) = rest.trim_end().strip_suffix(QUOTES) {
                return Ok(Some(one.to_owned()));
            }
            block = true;
            line = rest;
        } else if block && let Some(before) = line.trim_end().strip_suffix(QUOTES) {
            text.push_str(before);
            // A closing line of its own ends the last line, not the message.
            if before.is_empty() && text.ends_with('\n') {
                text.pop();
            }
            return Ok(Some(text));
        }
        if block {
            text.push_str(line);
            if !text.is_empty() {
                text.push('\n');
            }
            show("... ");
            continue;
        }
        match line.strip_suffix('\\') {
            Some(start) => {
                text.push_str(start);
                text.push('\n');
                show("... ");
            }
            None => {
                text.push_str(line);
                return Ok(Some(text));
            }
        }
    }
}

/// Sampling settings and the reply length, as `/set` changes them.
#[derive(Debug, Clone)]
struct Settings {
    sampling: SamplingParams,
    max_tokens: usize,
}

impl Settings {
    /// Applies `/set KEY VALUE`; an error names what was wrong and changes nothing.
    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let mut next = self.clone();
        let s = &mut next.sampling;
        let float = || {
            value
                .parse::<f32>()
                .map_err(|_| format!("{key}: `{value}` is not a number"))
        };
        let count = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{key}: `{value}` is not a count"))
        };
        match key {
            "temperature" => s.temperature = float()?,
            "top_p" => s.top_p = float()?,
            "top_k" => s.top_k = count()?,
            "min_p" => s.min_p = float()?,
            "repetition_penalty" => s.repetition_penalty = float()?,
            "seed" if value == "none" => s.seed = None,
            "seed" => s.seed = Some(count()? as u64),
            "max_tokens" => {
                next.max_tokens = parse_max_tokens(value).map_err(|e| format!("{key}: {e}"))?;
            }
            _ => {
                return Err(format!(
                    "unknown setting {key:?}; /set takes temperature, top_p, top_k, min_p, \
                     repetition_penalty, seed or max_tokens"
                ));
            }
        }
        next.sampling.validate().map_err(|e| e.to_string())?;
        *self = next;
        Ok(())
    }

    fn show(&self) -> String {
        let s = &self.sampling;
        let seed = s.seed.map_or("none".into(), |v| v.to_string());
        format!(
            "temperature {}, top_p {}, top_k {}, min_p {}, repetition_penalty {}, seed {seed}, \
             max_tokens {}",
            s.temperature, s.top_p, s.top_k, s.min_p, s.repetition_penalty, self.max_tokens
        )
    }
}

/// Timing of one reply.
#[derive(Debug, Clone)]
struct TurnStats {
    prompt_tokens: usize,
    reused: usize,
    prefill: Duration,
    generated: usize,
    decode: Duration,
    finish: &'static str,
}

impl TurnStats {
    fn line(&self) -> String {
        let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
        format!(
            "{} tokens at {:.1} tok/s; prompt {} tokens ({} reused from the cache) at {:.1} \
             tok/s; finish: {}",
            self.generated,
            rate(self.generated.saturating_sub(1), self.decode),
            self.prompt_tokens,
            self.reused,
            rate(self.prompt_tokens - self.reused, self.prefill),
            self.finish,
        )
    }
}

/// A conversation with one model.
struct Session {
    engine: Arc<Engine>,
    /// Runs the replies; its prefix cache keeps the conversation's KV rows between turns.
    scheduler: Scheduler,
    system: Option<String>,
    /// User and assistant messages, alternating.
    turns: Vec<ChatMessage>,
    settings: Settings,
    last: Option<TurnStats>,
    /// With `--device hybrid`: the executor, for `/stats`.
    hybrid: Option<Arc<strata_exec::HybridExecutor>>,
}

impl Session {
    fn new(engine: Arc<Engine>, system: Option<String>, settings: Settings) -> Session {
        let ctx = engine.model.config().max_position_embeddings;
        // Room in the prefix cache for one whole conversation: each turn then runs only
        // the tokens after what the last one left there.
        let per_token = engine.model.cache_memory().kv_per_token();
        let config = SchedulerConfig {
            max_batch: 1,
            max_queue: 1,
            step_tokens: engine.prefill_chunk,
            ctx_size: ctx,
            prefix_cache_bytes: usize::try_from(per_token.saturating_mul(ctx as u64))
                .unwrap_or(usize::MAX),
        };
        Session {
            scheduler: Scheduler::start(Arc::clone(&engine), config),
            engine,
            system,
            turns: Vec::new(),
            settings,
            last: None,
            hybrid: None,
        }
    }

    fn messages(&self) -> Vec<ChatMessage> {
        let system = self.system.iter().map(|s| ChatMessage::new("system", s));
        system.chain(self.turns.iter().cloned()).collect()
    }

    /// The conversation with `self.turns`' last user message, as prompt tokens; the oldest
    /// exchanges are dropped (and said so) while it leaves no room in the context.
    fn prompt(&mut self) -> anyhow::Result<Vec<u32>> {
        let ctx = self.engine.model.config().max_position_embeddings;
        loop {
            let prompt = self.engine.chat_prompt(&self.messages())?;
            if prompt.len() < ctx {
                return Ok(prompt);
            }
            if self.turns.len() < 3 {
                bail!(
                    "the message takes {} tokens with the template; the context holds {ctx}",
                    prompt.len()
                );
            }
            self.turns.drain(..2);
            eprintln!("[the context is full: the oldest exchange is forgotten]");
        }
    }

    /// Answers `text`, streaming the reply to `out`. A stopped reply keeps what was written;
    /// one stopped before its first word is dropped with its message.
    /// A message that fails (too long, out of memory, a model error) is dropped too.
    fn turn(&mut self, text: &str, flags: &Interrupts, out: &mut impl Write) -> anyhow::Result<()> {
        self.turns.push(ChatMessage::new("user", text));
        flags.stop.store(false, Ordering::SeqCst);
        flags.replying.store(true, Ordering::SeqCst);
        let result = self
            .prompt()
            .and_then(|prompt| self.reply(prompt, flags, out));
        flags.replying.store(false, Ordering::SeqCst);
        match result {
            Ok((reply, stats)) => {
                if stats.finish == "stopped" && reply.is_empty() {
                    self.turns.pop();
                } else {
                    self.turns.push(ChatMessage::new("assistant", reply));
                }
                self.last = Some(stats);
                Ok(())
            }
            Err(e) => {
                self.turns.pop();
                Err(e)
            }
        }
    }

    /// Runs `prompt` on the scheduler (from the longest prefix its cache holds) and streams
    /// the reply to `out`; Ctrl-C cancels the sequence between two steps.
    fn reply(
        &mut self,
        prompt: Vec<u32>,
        flags: &Interrupts,
        out: &mut impl Write,
    ) -> anyhow::Result<(String, TurnStats)> {
        let s = self.settings.clone();
        self.engine.check_cache_memory(
            (prompt.len() + s.max_tokens) as u64,
            self.scheduler.prefix_cache_usage().0 as u64,
            "lower max_tokens (/set max_tokens N) or /clear the conversation",
        )?;
        let mut stats = TurnStats {
            prompt_tokens: prompt.len(),
            reused: 0,
            prefill: Duration::ZERO,
            generated: 0,
            decode: Duration::ZERO,
            finish: "stopped",
        };
        let (tx, rx) = channel();
        let request = GenRequest::new(prompt, s.max_tokens, s.sampling);
        let id = self
            .scheduler
            .submit(request, Box::new(move |e| tx.send(e).is_ok()))?;
        let started = Instant::now();
        let mut first = None;
        let mut reply = String::new();
        loop {
            if flags.stop.load(Ordering::SeqCst) {
                self.scheduler.cancel(id);
                break;
            }
            let event = match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(event) => event,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => bail!("the reply ended without a word"),
            };
            let first = *first.get_or_insert_with(Instant::now);
            stats.prefill = first - started;
            let piece = match event {
                scheduler::Event::Token { text, .. } => {
                    stats.generated += 1;
                    text
                }
                scheduler::Event::Done {
                    finish,
                    text,
                    cached_tokens,
                    ..
                } => {
                    stats.finish = finish_name(&finish);
                    stats.reused = cached_tokens;
                    text
                }
                scheduler::Event::Failed(message) => bail!("{message}"),
            };
            out.write_all(piece.as_bytes())
                .and_then(|()| out.flush())
                .context("writing the reply to stdout")?;
            reply.push_str(&piece);
            stats.decode = first.elapsed();
            if stats.finish != "stopped" {
                break;
            }
        }
        writeln!(out).context("writing the reply to stdout")?;
        Ok((reply.trim().to_owned(), stats))
    }

    /// Runs a slash command; `false` when the user leaves.
    fn command(&mut self, line: &str) -> bool {
        let (name, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let rest = rest.trim();
        match name {
            "/bye" | "/exit" => return false,
            "/help" | "/?" => eprintln!("{HELP}"),
            "/clear" => {
                self.turns.clear();
                eprintln!("[conversation cleared]");
            }
            "/system" if rest.is_empty() => {
                self.system = None;
                eprintln!("[system message removed]");
            }
            "/system" => {
                self.system = Some(rest.to_owned());
                eprintln!("[system message set]");
            }
            "/set" => match rest.split_once(char::is_whitespace) {
                None if rest.is_empty() => eprintln!("{}", self.settings.show()),
                None => eprintln!("error: /set {rest}: give a value, e.g. /set {rest} 0.7"),
                Some((key, value)) => match self.settings.set(key, value.trim()) {
                    Ok(()) => eprintln!("[{}]", self.settings.show()),
                    Err(e) => eprintln!("error: {e}"),
                },
            },
            "/stats" => self.print_stats(),
            other => eprintln!("error: unknown command {other}; /help lists the commands"),
        }
        true
    }

    fn print_stats(&self) {
        match &self.last {
            Some(t) => eprintln!("last reply: {}", t.line()),
            None => eprintln!("last reply: none yet"),
        }
        let (bytes, blocks) = self.scheduler.prefix_cache_usage();
        eprintln!(
            "conversation: {} messages; {:.1} MiB of KV rows cached ({blocks} blocks); a \
             {}-token context",
            self.turns.len(),
            bytes as f64 / (1u64 << 20) as f64,
            self.engine.model.config().max_position_embeddings
        );
        eprintln!("settings: {}", self.settings.show());
        if let Some(exec) = &self.hybrid {
            eprintln!("hybrid, policy {}: {}", exec.policy_name(), exec.stats());
        }
    }
}

pub fn run(args: ChatArgs) -> anyhow::Result<()> {
    let dir = args.model.dir()?;
    let loaded = args.device.load_engine(&args.model, &dir)?;
    let (engine, hybrid, load) = (loaded.engine, loaded.hybrid, loaded.took);
    let settings = Settings {
        sampling: args.sampling.params(),
        max_tokens: args.max_tokens,
    };
    settings.sampling.validate()?;
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "[loaded {} in {}; /help for help, Ctrl-D or /bye to leave]",
            dir.display(),
            seconds(load)
        );
    }
    // Ctrl-C during the load still ends the program at once.
    let (tx, rx) = channel();
    let flags = Arc::new(Interrupts::default());
    spawn_interrupts(tx.clone(), flags.clone())?;
    spawn_reader(tx);
    let mut session = Session::new(Arc::new(engine), args.system.clone(), settings);
    session.hybrid = hybrid;
    let mut stdout = std::io::stdout();
    while let Some(text) = read_message(&rx, interactive)? {
        if text.starts_with('/') {
            if !session.command(text.trim()) {
                break;
            }
            continue;
        }
        if text.trim().is_empty() {
            continue;
        }
        match session.turn(&text, &flags, &mut stdout) {
            Ok(()) if session.last.as_ref().is_some_and(|t| t.finish == "stopped") => {
                eprintln!("[reply stopped]");
            }
            Ok(()) => {}
            // A closed stdout ends the program (main treats it as success).
            Err(e) if crate::is_broken_pipe(&e) => return Err(e),
            Err(e) => eprintln!("error: {}", crate::error_chain(&e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_runtime::scheduler::generate_batch;

    /// The messages `read_message` makes of `lines`, until it reports the end.
    fn messages(lines: &[&str]) -> Vec<String> {
        let (tx, rx) = channel();
        for l in lines {
            tx.send(Event::Line(l.to_string())).unwrap();
        }
        tx.send(Event::Eof).unwrap();
        std::iter::from_fn(|| read_message(&rx, false).unwrap()).collect()
    }

    #[test]
    fn continued_lines_and_blocks_are_one_message() {
        let m = messages(&[
            "a\\",
            "b",
            r#"""""#,
            "c",
            "",
            "d",
            r#"""""#,
            r#""""e""""#,
            "f",
        ]);
        assert_eq!(m, ["a\nb", "c\n\nd", "e", "f"]);
        let m = messages(&[r#""""x"#, r#"y""""#, "z"]);
        assert_eq!(m, ["x\ny", "z"]);
        // An unfinished block ends with the input, unsent.
        assert!(messages(&[r#"""""#, "open"]).is_empty());
    }

    #[test]
    fn set_validates_before_it_changes_anything() {
        let mut s = Settings {
            sampling: SamplingParams::default(),
            max_tokens: 8,
        };
        s.set("temperature", "0.5").unwrap();
        s.set("seed", "3").unwrap();
        assert_eq!((s.sampling.temperature, s.sampling.seed), (0.5, Some(3)));
        for (k, v) in [
            ("temperature", "-1"),
            ("top_p", "x"),
            ("max_tokens", "0"),
            ("x", "1"),
        ] {
            assert!(s.set(k, v).is_err(), "{k} {v}");
        }
        assert_eq!((s.sampling.temperature, s.max_tokens), (0.5, 8));
        s.set("seed", "none").unwrap();
        assert_eq!(s.sampling.seed, None);
    }

    /// A turn that runs after the cached conversation writes what a fresh run of the whole
    /// conversation writes (greedy): reusing the cache changes nothing.
    #[test]
    fn a_turn_from_the_cache_equals_a_fresh_run() {
        let dir = std::path::Path::new(crate::model_arg::DEFAULT_MODEL);
        let opts = strata_model::LoadOptions::new(strata_model::Precision::Fast);
        let engine = Arc::new(Engine::load(dir, opts).unwrap());
        let settings = Settings {
            sampling: SamplingParams::greedy(),
            max_tokens: 16,
        };
        let mut session = Session::new(engine.clone(), Some("Be brief.".into()), settings);
        let flags = Interrupts::default();
        session.turn("Hello", &flags, &mut Vec::new()).unwrap();
        let mut messages = session.messages();
        let mut second = Vec::new();
        session.turn("And then?", &flags, &mut second).unwrap();
        assert!(session.last.as_ref().unwrap().reused > 0);
        messages.push(ChatMessage::new("user", "And then?"));
        let prompt = engine.chat_prompt(&messages).unwrap();
        let request = GenRequest::new(prompt, 16, SamplingParams::greedy());
        let (out, _) = generate_batch(&engine, &[request], |_, _| {}).unwrap();
        assert_eq!(
            String::from_utf8(second).unwrap(),
            format!("{}\n", out[0].text)
        );
    }
}
