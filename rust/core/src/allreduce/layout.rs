//! The IPC slab of one rank, shared with kernels/allreduce.cuh:
//! `[header | flags | pad to SIGNAL_BYTES | slot 0 | slot 1]`.

use super::limits::Limits;
use crate::error::{Error, Result};

/// Smallest group an all-reduce runs over.
pub const MIN_WORLD: u32 = 2;
/// Largest group the kernels address (flag rows and peer tables are this wide).
pub const MAX_WORLD: u32 = 8;

/// `rank` of a group of `world` ranks the runtime can serve:
/// `MIN_WORLD..=MAX_WORLD` ranks (the one statement of the bound; Python
/// asks it through `_core.allreduce_check_world`), `rank < world`.
pub fn check_world(rank: u32, world: u32) -> Result<()> {
    if !(MIN_WORLD..=MAX_WORLD).contains(&world) || rank >= world {
        return Err(Error::InvalidValue {
            op: "AllReduce",
            operand: "world".into(),
            expected: format!("{MIN_WORLD}..={MAX_WORLD} ranks and rank < world").into(),
            got: format!("rank {rank} of {world}"),
        });
    }
    Ok(())
}
/// Largest grid of any all-reduce launch (one flag row per CTA).
pub const MAX_CTAS: u32 = 128;
pub const FLAGS_OFFSET: u64 = 256;
pub const SIGNAL_BYTES: u64 = 8192;
/// Error code the kernels record: `ERR_TIMEOUT | rank` that did not arrive.
pub const ERR_TIMEOUT: u32 = 0x100;
/// Slots are 256-byte aligned, like every CUDA allocation.
pub const SLOT_ALIGN: u64 = 256;

const _: () = assert!(FLAGS_OFFSET + (MAX_CTAS * MAX_WORLD * 4) as u64 <= SIGNAL_BYTES);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlabLayout {
    /// Bytes of one staging slot (each launch uses slot `epoch & 1`).
    pub slot_bytes: u64,
}

impl SlabLayout {
    /// The slab whose slots serve every call `limits` route (see
    /// [`Limits::slot_bytes`]). Limits are bounded, so this cannot overflow.
    pub fn for_limits(limits: &Limits, twoshot_push: bool) -> Self {
        Self::for_max_bytes(limits.slot_bytes(twoshot_push))
            .expect("bounded limits give a slab far below 2^64 bytes")
    }

    /// A slab whose slots hold `max_bytes`, plus one alignment unit of headroom:
    /// the push two-shot stages 2 * world regions of the largest shard, at most
    /// 2 * MAX_WORLD packs (<= SLOT_ALIGN bytes) more than twice its bytes.
    pub fn for_max_bytes(max_bytes: u64) -> Option<Self> {
        let slot_bytes = max_bytes.checked_next_multiple_of(SLOT_ALIGN)?.checked_add(SLOT_ALIGN)?;
        slot_bytes.checked_mul(2)?.checked_add(SIGNAL_BYTES)?;
        Some(SlabLayout { slot_bytes })
    }

    pub fn total_bytes(&self) -> u64 {
        SIGNAL_BYTES + 2 * self.slot_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants kernels/allreduce.cuh defines must match these.
    #[test]
    fn constants_match_the_kernel_header() {
        let header = include_str!("../../../../kernels/allreduce.cuh");
        for (name, value) in [
            ("AR_MAX_WORLD", MAX_WORLD as u64),
            ("AR_MAX_CTAS", MAX_CTAS as u64),
            ("AR_FLAGS_OFFSET", FLAGS_OFFSET),
            ("AR_SIGNAL_BYTES", SIGNAL_BYTES),
            ("AR_ERR_TIMEOUT", ERR_TIMEOUT as u64),
        ] {
            let line = header
                .lines()
                .find(|l| l.starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} not defined"));
            let text = line.split_whitespace().nth(2).unwrap().trim_end_matches('u');
            let parsed = if let Some(hex) = text.strip_prefix("0x") {
                u64::from_str_radix(hex, 16).unwrap()
            } else {
                text.parse().unwrap()
            };
            assert_eq!(parsed, value, "{name}");
        }
    }

    #[test]
    fn slots_are_aligned_and_hold_the_maximum() {
        let l = SlabLayout::for_max_bytes(86016).unwrap();
        assert_eq!(l.slot_bytes, 86016 + 256);
        let l = SlabLayout::for_max_bytes(100).unwrap();
        assert_eq!(l.slot_bytes, 512);
        let l = SlabLayout::for_max_bytes(1000).unwrap();
        assert_eq!(l.slot_bytes, 1280);
        assert_eq!(l.total_bytes(), 8192 + 2560);
        assert!(2 * MAX_WORLD as u64 * 16 <= SLOT_ALIGN);
        assert!(SlabLayout::for_max_bytes(u64::MAX).is_none());
        let limits = Limits::new(16384, 73728, 786432, 896).unwrap();
        assert_eq!(SlabLayout::for_limits(&limits, true).slot_bytes, 2 * 786432 + 256);
        assert_eq!(SlabLayout::for_limits(&limits, false).slot_bytes, 786432 + 256);
        let max = Limits::new(1 << 40, 1 << 40, 1 << 40, 1).unwrap();
        assert_eq!(SlabLayout::for_limits(&max, true).total_bytes(), 8192 + 2 * ((2 << 40) + 256));
    }
}
