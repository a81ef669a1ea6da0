//! Byte ceilings of the all-reduce routes, and the one rule that sizes a
//! staging slot from them.

use std::fmt;

use crate::error::{Error, Result};

const OP: &str = "Limits";

/// Largest ceiling: 1 TiB, the largest unit of the byte-size grammar. Every
/// slot size derived from limits stays far inside 64 bits.
pub const MAX_LIMIT_BYTES: u64 = 1 << 40;
/// Largest two-shot row width, in elements.
pub const MAX_ROW_ELEMS: u64 = 1 << 31;
/// A slot always holds at least one 16-byte pack.
const MIN_SLOT_BYTES: u64 = 16;

/// Inclusive byte ceilings of each route; 0 turns a route off. Built only
/// through [`Limits::new`] (or `Default`), so every field is in range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    oneshot_max: u64,
    fused_max: u64,
    twoshot_max: u64,
    twoshot_row_elems: u64,
}

/// The fields of [`Limits`], for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitField {
    OneshotMax,
    FusedMax,
    TwoshotMax,
    TwoshotRowElems,
}

impl LimitField {
    pub const fn name(self) -> &'static str {
        match self {
            LimitField::OneshotMax => "oneshot_max",
            LimitField::FusedMax => "fused_max",
            LimitField::TwoshotMax => "twoshot_max",
            LimitField::TwoshotRowElems => "twoshot_row_elems",
        }
    }

    /// The accepted values, as messages print them.
    pub const fn accepted(self) -> &'static str {
        match self {
            LimitField::TwoshotRowElems => "an element count in 1..=2^31",
            _ => "a byte count in 0..=2^40 (0 turns the route off)",
        }
    }

    /// Checks a value of this field; `got` prints it as the caller saw it.
    pub fn check(self, value: u64) -> Result<u64> {
        let ok = match self {
            LimitField::TwoshotRowElems => (1..=MAX_ROW_ELEMS).contains(&value),
            _ => value <= MAX_LIMIT_BYTES,
        };
        if ok {
            Ok(value)
        } else {
            Err(self.refuse(value.to_string()))
        }
    }

    /// The error for a value of this field that is out of range or not a count.
    pub fn refuse(self, got: String) -> Error {
        Error::InvalidValue {
            op: OP,
            operand: self.name().into(),
            expected: self.accepted().into(),
            got,
        }
    }
}

impl Limits {
    /// Defaults measured on NVLink H200s (see `b12x.comm.pcie.allreduce`):
    /// 512 KiB one-shot and fused ceilings, a 32 MiB two-shot ceiling, rows
    /// of 4096 elements.
    pub const DEFAULT: Limits = Limits {
        oneshot_max: 512 << 10,
        fused_max: 512 << 10,
        twoshot_max: 32 << 20,
        twoshot_row_elems: 4096,
    };

    /// Limits with every field checked; the error names the first bad field.
    pub fn new(
        oneshot_max: u64,
        fused_max: u64,
        twoshot_max: u64,
        twoshot_row_elems: u64,
    ) -> Result<Limits> {
        Ok(Limits {
            oneshot_max: LimitField::OneshotMax.check(oneshot_max)?,
            fused_max: LimitField::FusedMax.check(fused_max)?,
            twoshot_max: LimitField::TwoshotMax.check(twoshot_max)?,
            twoshot_row_elems: LimitField::TwoshotRowElems.check(twoshot_row_elems)?,
        })
    }

    #[inline]
    pub const fn oneshot_max(&self) -> u64 {
        self.oneshot_max
    }
    #[inline]
    pub const fn fused_max(&self) -> u64 {
        self.fused_max
    }
    #[inline]
    pub const fn twoshot_max(&self) -> u64 {
        self.twoshot_max
    }
    /// Two-shot accepts `numel % (world * row_elems) == 0` only (spec §5.2).
    #[inline]
    pub const fn twoshot_row_elems(&self) -> u64 {
        self.twoshot_row_elems
    }

    /// Bytes one staging slot must hold for any call these limits route:
    /// the largest ceiling, where the push two-shot counts twice (it stages
    /// the peers' shards and the gathered results side by side). The slab
    /// adds one alignment unit on top for the push two-shot's rounding of
    /// shards (see [`super::SlabLayout::for_limits`]).
    pub const fn slot_bytes(&self, twoshot_push: bool) -> u64 {
        let twoshot = if twoshot_push { 2 * self.twoshot_max } else { self.twoshot_max };
        let mut n = MIN_SLOT_BYTES;
        if self.oneshot_max > n {
            n = self.oneshot_max;
        }
        if self.fused_max > n {
            n = self.fused_max;
        }
        if twoshot > n {
            n = twoshot;
        }
        n
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Limits(oneshot_max={}, fused_max={}, twoshot_max={}, twoshot_row_elems={})",
            self.oneshot_max, self.fused_max, self.twoshot_max, self.twoshot_row_elems
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_range_checked_by_name() {
        assert_eq!(Limits::new(512 << 10, 512 << 10, 32 << 20, 4096).unwrap(), Limits::DEFAULT);
        assert!(Limits::new(0, 0, 0, 1).is_ok());
        assert!(
            Limits::new(MAX_LIMIT_BYTES, MAX_LIMIT_BYTES, MAX_LIMIT_BYTES, MAX_ROW_ELEMS).is_ok()
        );
        let cases = [
            (Limits::new(MAX_LIMIT_BYTES + 1, 0, 0, 1), "oneshot_max"),
            (Limits::new(0, u64::MAX, 0, 1), "fused_max"),
            (Limits::new(0, 0, 1 << 41, 1), "twoshot_max"),
            (Limits::new(0, 0, 0, 0), "twoshot_row_elems"),
            (Limits::new(0, 0, 0, MAX_ROW_ELEMS + 1), "twoshot_row_elems"),
        ];
        for (result, field) in cases {
            let e = result.unwrap_err().to_string();
            assert!(e.starts_with(&format!("Limits: {field} expected ")), "{e}");
        }
    }

    #[test]
    fn slot_holds_the_largest_ceiling_and_twice_the_push_two_shot() {
        let l = Limits::new(16384, 73728, 786432, 896).unwrap();
        assert_eq!(l.slot_bytes(false), 786432);
        assert_eq!(l.slot_bytes(true), 2 * 786432);
        let small = Limits::new(0, 0, 0, 1).unwrap();
        assert_eq!(small.slot_bytes(true), 16);
        let fused = Limits::new(16, 1 << 20, 4096, 8).unwrap();
        assert_eq!(fused.slot_bytes(true), 1 << 20);
        let max = Limits::new(MAX_LIMIT_BYTES, 0, MAX_LIMIT_BYTES, 1).unwrap();
        assert_eq!(max.slot_bytes(true), 2 * MAX_LIMIT_BYTES);
    }
}
