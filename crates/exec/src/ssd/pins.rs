//! Hot experts pinned in the cache from usage statistics (which ones:
//! `strata_policy::slots::pins`, shared with the simulator) (Fiddler's and KTransformers'
//! profile, one level down): the experts a routing trace used most are read at start, in one
//! burst of reads in flight together, and never evicted, so the first tokens find them and a
//! run of cold experts cannot push them out.

use std::collections::HashSet;
use std::path::Path;
use std::time::Instant;

use super::{SsdTier, State, size};
use crate::{Error, Result};

/// A routing trace's expert activation counts, `[moe layer][expert]` (`strata trace`),
/// for [`super::SsdOptions::pin_profile`]; an error naming the trace.
pub fn pin_profile_from_trace(path: &Path) -> Result<Vec<Vec<u64>>> {
    let (_, w) = strata_sim::trace::read_file(path)
        .map_err(|e| Error::Config(format!("expert cache pins from {}: {e}", path.display())))?;
    Ok(w.profile())
}

/// Checks a profile against the model's MoE layers and their expert counts.
pub(crate) fn check_profile(profile: &[Vec<u64>], experts: &[usize]) -> Result<()> {
    let shape: Vec<usize> = profile.iter().map(Vec::len).collect();
    if shape != experts {
        return Err(Error::Config(format!(
            "the pin profile has {} moe layers of {:?} experts, the model {} of {:?}",
            shape.len(),
            shape.first(),
            experts.len(),
            experts.first()
        )));
    }
    Ok(())
}

/// What reading the pinned experts at start did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PinnedRead {
    /// Experts pinned.
    pub experts: usize,
    /// Bytes read for them.
    pub bytes: u64,
    /// Seconds the reads took, all in flight together.
    pub seconds: f64,
}

impl std::fmt::Display for PinnedRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} pinned experts ({}) read in {:.2} s ({:.2} GB/s)",
            self.experts,
            size(self.bytes),
            self.seconds,
            self.bytes as f64 / self.seconds.max(1e-9) / 1e9
        )
    }
}

impl SsdTier {
    /// Reads every pinned expert into its slot, all in flight together, and waits for them.
    pub(super) fn read_pinned(&self, pinned: &[(usize, u32)]) -> Result<PinnedRead> {
        let started = Instant::now();
        let keep: HashSet<_> = pinned.iter().map(|&(l, e)| (l as u32, e)).collect();
        let mut st = self.lock();
        let st: &mut State = &mut st;
        let before = (st.stats.bytes_read, st.stats.read_seconds);
        let mut in_flight = 0;
        for &key in &keep {
            if !self.read(st, key, &keep) {
                return Err(Error::Config(format!(
                    "no slot for pinned expert {} of moe layer {}",
                    key.1, key.0
                )));
            }
            in_flight += 1;
        }
        for _ in 0..in_flight {
            let done = self
                .lock_reader()
                .wait()
                .ok_or_else(|| Error::Config("the expert reads stopped".into()))?;
            Self::land(st, done)?;
        }
        // The pins' reads are the start's, not any token's.
        let bytes = st.stats.bytes_read - before.0;
        (st.stats.bytes_read, st.stats.read_seconds) = before;
        Ok(PinnedRead {
            experts: keep.len(),
            bytes,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_of_another_shape_is_refused() {
        let profile = vec![vec![5, 0, 9], vec![9, 1, 0]];
        assert!(check_profile(&profile, &[3, 3]).is_ok());
        let e = check_profile(&profile, &[3, 3, 3]).unwrap_err().to_string();
        assert!(
            e.contains("2 moe layers") && e.contains("the model 3"),
            "{e}"
        );
    }
}
