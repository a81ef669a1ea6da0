//! Launch geometry of the all-reduce kernels. A CTA of one rank waits for the
//! same CTA of every peer, so every CTA of a launch must be resident at once:
//! grids never exceed the SM count (one CTA per SM always fits) nor MAX_CTAS.

use super::layout::MAX_CTAS;

/// Fused rows are held in registers: at most 4 packs per thread, 1024 threads.
pub const FUSED_MAX_ROW_PACKS: u32 = 4 * 1024;
const ONESHOT_THREADS: u32 = 512;
const TWOSHOT_THREADS: u32 = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub grid: u32,
    pub block: u32,
    /// Packs per thread per row (fused only; 1, 2 or 4), else 1.
    pub packs_per_thread: u32,
}

fn cap(multiprocessors: u32) -> u32 {
    multiprocessors.clamp(1, MAX_CTAS)
}

fn warps(n: u64, max: u32) -> u32 {
    (n.div_ceil(32) * 32).clamp(32, max as u64) as u32
}

/// One pack (16 bytes) per thread per step; enough CTAs that every pack up to
/// 256 KiB is in flight at once.
pub fn oneshot_geometry(packs: u64, multiprocessors: u32) -> Geometry {
    let block = warps(packs, ONESHOT_THREADS);
    let grid = packs.div_ceil(block as u64).clamp(1, cap(multiprocessors) as u64) as u32;
    Geometry { grid, block, packs_per_thread: 1 }
}

/// One CTA per row (grid-stride over rows beyond the cap); a row's packs are
/// spread over up to 1024 threads, 1, 2 or 4 per thread.
pub fn fused_geometry(rows: u64, row_packs: u32, multiprocessors: u32) -> Option<Geometry> {
    if row_packs == 0 || row_packs > FUSED_MAX_ROW_PACKS || rows == 0 {
        return None;
    }
    let block = warps(row_packs as u64, 1024);
    let packs_per_thread = row_packs.div_ceil(block).next_power_of_two();
    let grid = rows.clamp(1, cap(multiprocessors) as u64) as u32;
    Some(Geometry { grid, block, packs_per_thread })
}

/// Enough CTAs for one pack per thread of the own shard, up to the cap.
pub fn twoshot_geometry(packs: u64, world: u32, multiprocessors: u32) -> Geometry {
    let shard = packs.div_ceil(world.max(1) as u64);
    let block = TWOSHOT_THREADS;
    let grid = shard.div_ceil(block as u64).clamp(1, cap(multiprocessors) as u64) as u32;
    Geometry { grid, block, packs_per_thread: 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_stay_resident() {
        for sms in [1, 36, 132, 200] {
            for packs in [1u64, 512, 16384, 1 << 21] {
                let g = oneshot_geometry(packs, sms);
                assert!(g.grid >= 1 && g.grid <= sms.min(MAX_CTAS), "{packs} {sms} {g:?}");
                assert!(g.block % 32 == 0 && g.block <= 512);
                let t = twoshot_geometry(packs, 2, sms);
                assert!(t.grid >= 1 && t.grid <= sms.min(MAX_CTAS));
            }
            let f = fused_geometry(1000, 896, sms).unwrap();
            assert!(f.grid <= sms.min(MAX_CTAS));
        }
    }

    #[test]
    fn oneshot_covers_256k_in_one_step() {
        let g = oneshot_geometry(16384, 132);
        assert_eq!(g, Geometry { grid: 32, block: 512, packs_per_thread: 1 });
        assert_eq!(oneshot_geometry(1, 132), Geometry { grid: 1, block: 32, packs_per_thread: 1 });
    }

    #[test]
    fn fused_packs_per_thread() {
        // 7168 bf16 = 896 packs: one per thread
        let g = fused_geometry(16, 896, 132).unwrap();
        assert_eq!(g, Geometry { grid: 16, block: 896, packs_per_thread: 1 });
        // 7168 fp32 = 1792 packs: two per thread
        assert_eq!(fused_geometry(1, 1792, 132).unwrap().packs_per_thread, 2);
        // 3 packs per thread round up to the 4-pack kernel
        assert_eq!(fused_geometry(1, 3000, 132).unwrap().packs_per_thread, 4);
        assert!(fused_geometry(1, 4097, 132).is_none());
        assert_eq!(fused_geometry(1, 1, 132).unwrap().block, 32);
    }
}
