//! Streaming detokenization with stop conditions.
//!
//! [`StreamDecoder`] takes generated ids one at a time and returns the text they complete
//! ([`StreamPiece`]), stopping at an end-of-sequence id or a stop string
//! ([`StopReason`]).
//!
//! A key design decision made here is to decode a short window of ids and diff it against
//! the previous window ("decode prefix and diff", as Hugging Face's text-generation-inference
//! and vLLM do) instead of decoding each id alone: one character may span several byte-level
//! tokens, and SentencePiece-style decoders change a token's text depending on what precedes
//! it. Text ending in U+FFFD (an incomplete UTF-8 sequence) is held back until the next id
//! completes it. Stop strings are matched on the emitted text, so they may span tokens; text
//! that could still be the start of a stop string is held back until it cannot.

use super::{TextError, Tokenizer};

/// Why generation stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-sequence id was generated (its text is not emitted).
    Eos(u32),
    /// A stop string appeared in the text (the text is cut before it).
    StopString(String),
}

/// What one id adds to the output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamPiece {
    /// Newly completed text (may be empty).
    pub text: String,
    /// Set once generation should stop; later ids add nothing.
    pub stop: Option<StopReason>,
}

/// Incremental detokenizer for one sequence.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    skip_special: bool,
    /// Special ids written into the text even when `skip_special` is set.
    kept_special: Vec<u32>,
    stop_ids: Vec<u32>,
    stop_strings: Vec<String>,
    ids: Vec<u32>,
    /// Start of the window decoded for context (its text was already produced).
    prefix_offset: usize,
    /// End of the ids whose text was already produced.
    read_offset: usize,
    /// Produced text not yet emitted because it may be the start of a stop string.
    held: String,
    stopped: Option<StopReason>,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder that stops on the tokenizer's end-of-sequence ids and on any of
    /// `stop_strings`; special tokens are left out of the text when `skip_special` is set.
    /// An empty stop string is an error.
    pub fn new(
        tokenizer: &'t Tokenizer,
        stop_strings: &[String],
        skip_special: bool,
    ) -> Result<Self, TextError> {
        if let Some(index) = stop_strings.iter().position(String::is_empty) {
            return Err(TextError::EmptyStop { index });
        }
        Ok(Self {
            tokenizer,
            skip_special,
            kept_special: Vec::new(),
            stop_ids: tokenizer.eos_ids().to_vec(),
            stop_strings: stop_strings.to_vec(),
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            held: String::new(),
            stopped: None,
        })
    }

    /// Replaces the ids that stop generation (by default the tokenizer's end-of-sequence
    /// ids); an empty list never stops on an id.
    pub fn set_stop_ids(&mut self, ids: &[u32]) {
        self.stop_ids = ids.to_vec();
    }

    /// Special ids whose text is kept although special tokens are skipped: the markers a
    /// tool-call parser reads (Mistral's `[TOOL_CALLS]` is a special token).
    pub fn keep_special(&mut self, ids: &[u32]) {
        self.kept_special = ids.to_vec();
    }

    /// Feeds one generated id and returns the text it completes.
    pub fn push(&mut self, id: u32) -> Result<StreamPiece, TextError> {
        if self.stopped.is_some() {
            return Ok(self.stopped_piece(String::new()));
        }
        if self.stop_ids.contains(&id) {
            // The text before an end of sequence is final: flush it.
            let text = self.flush()?;
            if self.stopped.is_none() {
                self.stopped = Some(StopReason::Eos(id));
            }
            return Ok(self.stopped_piece(text));
        }
        if self.skip_special && self.kept_special.contains(&id) {
            // Decoding skips it wherever it stands, so its text follows the text before it
            // and the window restarts after it.
            let mut text = self.take_window()?;
            self.ids.push(id);
            (self.prefix_offset, self.read_offset) = (self.ids.len(), self.ids.len());
            text.push_str(&self.tokenizer.id_to_token(id).unwrap_or_default());
            return Ok(self.release(text));
        }
        self.ids.push(id);
        let prefix = self.tokenizer.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special,
        )?;
        let full = self
            .tokenizer
            .decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        if full.ends_with('\u{FFFD}') {
            return Ok(StreamPiece::default());
        }
        let Some(delta) = new_suffix(&prefix, &full) else {
            return Ok(StreamPiece::default());
        };
        let delta = delta.to_string();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(self.release(delta))
    }

    /// Ends the sequence (for example at the token limit) and returns the text still held
    /// back: an incomplete character (as U+FFFD) or a partial stop string.
    pub fn finish(&mut self) -> Result<StreamPiece, TextError> {
        if self.stopped.is_some() {
            return Ok(self.stopped_piece(String::new()));
        }
        let text = self.flush()?;
        Ok(self.stopped_piece(text))
    }

    /// Every id fed so far, the stopping id excluded.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Why the sequence stopped, once it has.
    pub fn stop_reason(&self) -> Option<&StopReason> {
        self.stopped.as_ref()
    }

    fn stopped_piece(&self, text: String) -> StreamPiece {
        StreamPiece {
            text,
            stop: self.stopped.clone(),
        }
    }

    /// The text of the ids not yet produced, incomplete characters included; the window
    /// then starts after them.
    fn take_window(&mut self) -> Result<String, TextError> {
        let prefix = self.tokenizer.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special,
        )?;
        let full = self
            .tokenizer
            .decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        let delta = new_suffix(&prefix, &full).unwrap_or_default().to_string();
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        Ok(delta)
    }

    /// Everything not yet emitted, checked once more for a stop string.
    fn flush(&mut self) -> Result<String, TextError> {
        let delta = self.take_window()?;
        self.held.push_str(&delta);
        if let Some((at, stop)) = self.find_stop() {
            self.held.truncate(at);
            self.stopped = Some(StopReason::StopString(stop));
        }
        Ok(std::mem::take(&mut self.held))
    }

    /// Adds produced text and emits what can no longer become part of a stop string.
    fn release(&mut self, delta: String) -> StreamPiece {
        self.held.push_str(&delta);
        if let Some((at, stop)) = self.find_stop() {
            self.held.truncate(at);
            self.stopped = Some(StopReason::StopString(stop));
            let text = std::mem::take(&mut self.held);
            return self.stopped_piece(text);
        }
        let keep = self
            .stop_strings
            .iter()
            .map(|s| partial_suffix_len(&self.held, s))
            .max()
            .unwrap_or(0);
        let emit_len = self.held.len() - keep;
        let rest = self.held.split_off(emit_len);
        let text = std::mem::replace(&mut self.held, rest);
        StreamPiece { text, stop: None }
    }

    /// The earliest stop string in the held text: (byte offset, stop string).
    fn find_stop(&self) -> Option<(usize, String)> {
        self.stop_strings
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, _)| at)
            .map(|(at, s)| (at, s.clone()))
    }
}

/// The text `full` adds after `prefix`, or `None` when it adds nothing yet. Decoders that
/// strip a leading space can make `full` not start with `prefix`; then the bytes past
/// `prefix.len()` are the new text, as in text-generation-inference.
fn new_suffix<'a>(prefix: &str, full: &'a str) -> Option<&'a str> {
    if full.len() <= prefix.len() {
        return None;
    }
    if let Some(rest) = full.strip_prefix(prefix) {
        return Some(rest);
    }
    full.get(prefix.len()..)
}

/// Length of the longest proper prefix of `stop` that `text` ends with.
fn partial_suffix_len(text: &str, stop: &str) -> usize {
    let max = stop.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&k| stop.is_char_boundary(k) && text.ends_with(&stop[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_suffix_len_finds_longest_overlap() {
        assert_eq!(partial_suffix_len("hello wor", "world"), 3);
        assert_eq!(partial_suffix_len("hello", "world"), 0);
        assert_eq!(partial_suffix_len("ab", "abab"), 2);
        assert_eq!(partial_suffix_len("xaba", "abab"), 3);
        // The whole stop string is a match, not a partial one.
        assert_eq!(partial_suffix_len("world", "world"), 0);
        assert_eq!(partial_suffix_len("", "world"), 0);
        // Multi-byte: "é" is two bytes; a partial match never splits it.
        assert_eq!(partial_suffix_len("caf\u{e9}", "\u{e9}t\u{e9}"), 2);
    }

    #[test]
    fn new_suffix_cases() {
        assert_eq!(new_suffix("ab", "abc"), Some("c"));
        assert_eq!(new_suffix("ab", "ab"), None);
        assert_eq!(new_suffix(" a", "ab"), None);
        assert_eq!(new_suffix(" a", "abcd"), Some("cd"));
    }
}
