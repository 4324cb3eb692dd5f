//! [`ExpertFormat`]: how one expert is laid out in a slot of [`crate::ExpertSlots`].

use crate::{Error, Result, WeightType};

/// How one expert is laid out in a slot: gate `[inter, hidden]`, up `[inter, hidden]` and
/// down `[hidden, inter]` back to back, gate and up in one storage type, down in the same
/// or another (a GGUF's Q4_K_M experts keep down in Q6_K in some layers); float experts
/// have one type throughout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExpertFormat {
    /// Storage type of gate and up.
    pub gate_up: WeightType,
    /// Storage type of down.
    pub down: WeightType,
}

impl ExpertFormat {
    /// One type for all three matrices.
    pub fn uniform(t: WeightType) -> ExpertFormat {
        ExpertFormat {
            gate_up: t,
            down: t,
        }
    }

    /// Fails unless experts of this shape can be stored so: rows are whole blocks, and
    /// floats are not mixed with other types.
    pub fn check(self, hidden: u32, inter: u32) -> Result<()> {
        let (h, i) = (hidden as usize, inter as usize);
        let (gu, d) = (self.gate_up, self.down);
        let mixed_floats = gu != d && !(gu.is_quantized() && d.is_quantized());
        if mixed_floats || !gu.fits_row(h) || !d.fits_row(i) {
            return Err(Error::Shape {
                op: "expert slots",
                message: format!(
                    "gate/up as {} over rows of {h}, down as {} over rows of {i}: rows must be \
                     whole blocks, and float experts have one type",
                    gu.name(),
                    d.name()
                ),
            });
        }
        Ok(())
    }

    /// Exact bytes of gate (or up) and of down.
    pub fn part_bytes(self, hidden: u32, inter: u32) -> [u64; 2] {
        [
            inter as u64 * self.gate_up.row_bytes(hidden as usize),
            hidden as u64 * self.down.row_bytes(inter as usize),
        ]
    }

    /// Byte offsets of gate, up and down in a slot.
    pub fn offsets(self, hidden: u32, inter: u32) -> [u64; 3] {
        let [part, _] = self.part_bytes(hidden, inter);
        [0, part, 2 * part]
    }

    /// Bytes of one expert, in whole 32-bit words.
    pub fn bytes(self, hidden: u32, inter: u32) -> u64 {
        let [part, down] = self.part_bytes(hidden, inter);
        (2 * part + down).next_multiple_of(4)
    }

    /// The storage type [`crate::Op::ExpertFfn`]'s `stage` reads: gate/up (0) or down (1).
    pub fn stage_type(self, stage: u32) -> WeightType {
        if stage == 0 { self.gate_up } else { self.down }
    }
}
