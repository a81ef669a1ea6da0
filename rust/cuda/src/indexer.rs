//! Launchers for the C4 indexer kernels (kernels/indexer_{decode,prefill,topk}.cu).
//!
//! One call enqueues, per supertile chunk of the page table, a scorer
//! (paged decode, or prefill over a shared page-table row) and the exact
//! top-k fold over that chunk and the carry. Everything here takes plain
//! values: device pointers, sizes and the scratch regions, already carved.
//! Grids depend only on the static shapes and the device's SM count, never on
//! device values, so the sequence is safe to capture in a CUDA graph.

use std::ffi::c_void;

use b12x_core::indexer::{PageFault, STATUS_WORDS};
use cudarc::driver::sys;

use crate::device::{loaded, with_context, STATUS_BYTES};
use crate::error::{CudaError, DriverContext, Result};
use crate::launch::{launch, LaunchConfig};
use crate::ptx::Kernel;

pub const PAGE_ROWS: u32 = 64;
pub const HEAD_DIM: u32 = 128;
/// Bytes of one page's payload: 64 x 128 e4m3 values, then 64 f32 scales.
pub const PAGE_BYTES: u64 = 64 * 128 + 64 * 4;
pub const MAX_HEADS: u32 = 64;
pub const SUPPORTED_TOPK: [u32; 3] = [512, 1024, 2048];
/// Supertile granularity: the prefill scorer's CTA covers 512 tokens.
pub const SUPERTILE_ALIGN: u32 = 512;

const DECODE_THREADS: u32 = 128;
const DECODE_WARPS: u32 = 4;
const DECODE_MAX_PAGES_PER_CTA: u32 = 256;
const PREFILL_THREADS: u32 = 256;
const PREFILL_TOKENS: u32 = 512;
const PREFILL_ROWS: u32 = 64;
const TOPK_THREADS: u32 = 1024;
/// The wgmma scorers (kernels/indexer_wgmma.cu): one warpgroup per CTA.
const WGMMA_THREADS: u32 = 128;
/// K ring depth of the decode and prefill wgmma scorers (WG_*_STAGES).
const WGMMA_DECODE_STAGES: u32 = 4;
const WGMMA_PREFILL_STAGES: u32 = 4;
const WGMMA_PREFILL_ROWS: u32 = 4;
/// Resident wgmma prefill CTAs per SM (register-bound at 64 heads).
const WGMMA_PREFILL_CTAS_PER_SM: u32 = 2;

/// Which scorer reads the page table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// One page-table row per query row.
    PagedDecode,
    /// One page-table row shared by every query row (prefill).
    SharedPrefill,
}

/// Which MMA the scorers use. Both give the same logits: FP8 products are
/// exact in f32 and every e4m3 value is an f16 value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MmaFlavor {
    /// `mma.sync m16n8k32 .e4m3` on the raw bytes (native on sm_89, sm_120).
    E4m3,
    /// FP8 converted to f16 once, `mma.sync m16n8k16 .f16` (sm_90 has no
    /// native e4m3 `mma.sync`: it would unpack both operands per MMA).
    F16,
    /// Hopper's warpgroup MMA on FP8 widened to f16 (`wgmma m64nNk16 .f16`,
    /// sm_90a PTX): exact products and fp32 accumulation, which Hopper's FP8
    /// wgmma does not keep (kernels/indexer_wgmma.cu).
    Wgmma,
}

impl MmaFlavor {
    pub fn for_compute_capability(cc: (u32, u32)) -> Self {
        match cc {
            (8, 9) | (12, _) => MmaFlavor::E4m3,
            (9, 0) => MmaFlavor::Wgmma,
            _ => MmaFlavor::F16,
        }
    }
}

/// Dynamic shared memory of a wgmma scorer CTA: the FP8 K ring, the rows' Q
/// as f16, the ring's scales, the weights (by lane, padded by 4 pairs per
/// lane), and the ring's page ids, plus 1 KiB
/// to align the base (mirrors `WgSmem` in kernels/indexer_wgmma.cu; the
/// kernel traps if given less).
pub fn wgmma_shared_bytes(heads_padded: u32, rows: u32) -> u32 {
    let n = heads_padded * rows;
    let stages = if rows == 1 { WGMMA_DECODE_STAGES } else { WGMMA_PREFILL_STAGES };
    stages * PAGE_ROWS * HEAD_DIM
        + n * HEAD_DIM * 2
        + stages * PAGE_ROWS * 4
        + (n + 16) * 4
        + stages * 4
        + 1024
}

/// Pages one wgmma prefill CTA scores: the whole chunk when the row blocks
/// alone fill two waves of resident CTAs, else the chunk split so they do.
pub fn wgmma_prefill_pages_per_cta(rows: u32, supertile: u32, multiprocessors: u32) -> u32 {
    let chunk_pages = (supertile / PAGE_ROWS).max(1);
    let row_blocks = rows.div_ceil(WGMMA_PREFILL_ROWS).max(1);
    let target = 2 * WGMMA_PREFILL_CTAS_PER_SM * multiprocessors.max(1);
    let splits = target.div_ceil(row_blocks).clamp(1, chunk_pages);
    chunk_pages.div_ceil(splits)
}

/// Everything one indexer call needs, as plain values.
#[derive(Debug, Clone, Copy)]
pub struct IndexerLaunch {
    pub device: u32,
    pub stream: u64,
    pub route: Route,
    /// Emit `pid * 64 + slot` instead of logical positions.
    pub physical: bool,
    /// MMA flavor of the scorers; None = the device's best
    /// ([`MmaFlavor::for_compute_capability`]). Tests force e4m3 on sm_90,
    /// where the driver emulates it, to cover that code path.
    pub flavor: Option<MmaFlavor>,
    pub rows: u32,
    pub heads: u32,
    /// Page-table width in pages (the bound tensor's, static).
    pub width: u32,
    pub topk: u32,
    /// K rows per chunk, a multiple of 512.
    pub supertile: u32,
    /// Slices per chunk row for the two-stage top-k (1 = one CTA per row).
    pub topk_slices: u32,
    /// Row capacity of the carry regions ([2, rows_cap, topk]).
    pub rows_cap: u32,
    /// e4m3 [rows, heads, 128], contiguous.
    pub q: u64,
    /// f32 [rows, heads], contiguous.
    pub weights: u64,
    /// Page base; page p at kcache + p * page_stride.
    pub kcache: u64,
    pub page_stride: u64,
    /// i32; row r at page_table + 4 * r * page_table_row_stride.
    pub page_table: u64,
    /// Elements; 0 = one row shared by every query row.
    pub page_table_row_stride: u64,
    /// i32 [rows].
    pub lengths: u64,
    /// i32 [1].
    pub active_width: u64,
    /// Pages of the K cache: page ids outside [0, pages) are unmapped.
    pub pages: u64,
    /// i32 [rows, topk].
    pub out_indices: u64,
    /// f32 [rows, topk], or 0.
    pub out_scores: u64,
    /// Scratch: f32 [rows_cap, supertile].
    pub logits: u64,
    /// Scratch: f32 / i32 [2, rows_cap, topk].
    pub carry_values: u64,
    pub carry_indices: u64,
    /// Scratch (topk_slices > 1): f32 / i32 [rows_cap, topk_slices, topk].
    pub partial_values: u64,
    pub partial_indices: u64,
}

#[repr(C)]
struct ScoreParams {
    q: u64,
    weights: u64,
    kcache: u64,
    page_table: u64,
    lengths: u64,
    active_width: u64,
    logits: u64,
    status: u64,
    page_stride: u64,
    pt_row_stride: u64,
    logits_row_stride: u64,
    rows: u32,
    heads: u32,
    width: u32,
    chunk_start: u32,
    chunk_len: u32,
    pages_per_cta: u32,
    pages: u32,
    pad: u32,
}

#[repr(C)]
struct TopkParams {
    logits: u64,
    lengths: u64,
    active_width: u64,
    page_table: u64,
    carry_values: u64,
    carry_indices: u64,
    part_values: u64,
    part_indices: u64,
    out_indices: u64,
    out_scores: u64,
    logits_row_stride: u64,
    pt_row_stride: u64,
    carry_half_stride: u64,
    rows: u32,
    width: u32,
    topk: u32,
    chunk: u32,
    num_chunks: u32,
    chunk_len: u32,
    slices: u32,
    slice_len: u32,
    physical: u32,
    pages: u32,
}

/// The kernels' page bound: every int32 page id is below 2^31, so a larger
/// cache bounds nothing more.
fn kernel_pages(pages: u64) -> u32 {
    pages.min(1 << 31) as u32
}

/// Reads and clears the status record of `ordinal` after waiting for every
/// kernel on the device: the first page id at or past its cache since the
/// last call, if any. Syncs the device, so never call it inside a graph
/// capture or on a hot path.
pub fn take_page_fault(ordinal: u32) -> Result<Option<PageFault>> {
    let modules = loaded(ordinal)?;
    let at = || format!("cuda:{ordinal}");
    with_context(modules.context, || {
        // SAFETY: waits for the current context's work.
        unsafe { sys::cuCtxSynchronize() }.result().ctx("cuCtxSynchronize", at)?;
        let mut words = [0u32; STATUS_WORDS];
        // SAFETY: the status record holds STATUS_WORDS u32s (device.rs).
        unsafe { sys::cuMemcpyDtoH_v2(words.as_mut_ptr().cast(), modules.status, STATUS_BYTES) }
            .result()
            .ctx("cuMemcpyDtoH", at)?;
        let fault = PageFault::from_words(&words);
        if fault.is_some() {
            // SAFETY: as above; no kernel is running (synced).
            unsafe { sys::cuMemsetD8_v2(modules.status, 0, STATUS_BYTES) }
                .result()
                .ctx("cuMemsetD8", at)?;
            // SAFETY: as above (the memset is on the legacy stream: finish it).
            unsafe { sys::cuCtxSynchronize() }.result().ctx("cuCtxSynchronize", at)?;
        }
        Ok(fault)
    })
}

/// Chunks the page table is scored in: ceil(width * 64 / supertile).
pub fn num_chunks(width: u32, supertile: u32) -> u32 {
    ((width as u64 * PAGE_ROWS as u64).div_ceil(supertile.max(1) as u64)) as u32
}

/// Tokens per top-k slice: the supertile split into `slices` parts, rounded
/// up to 512 (slices start 16-byte aligned; trailing slices may be empty).
pub fn slice_len(supertile: u32, slices: u32) -> u32 {
    supertile.div_ceil(slices.max(1)).next_multiple_of(SUPERTILE_ALIGN)
}

/// Pages one decode CTA scores: about eight CTAs' worth of work per SM
/// across all rows (a few waves, so uneven live lengths even out), at least
/// one page per warp.
pub fn decode_pages_per_cta(rows: u32, supertile: u32, multiprocessors: u32) -> u32 {
    let pages = (supertile / PAGE_ROWS) as u64 * rows.max(1) as u64;
    let target_ctas = multiprocessors.max(1) as u64 * 8;
    (pages.div_ceil(target_ctas) as u32).clamp(DECODE_WARPS, DECODE_MAX_PAGES_PER_CTA)
}

const OP: &str = "indexer launch";

fn invalid(operand: &'static str, expected: String, got: impl ToString) -> CudaError {
    CudaError::Core(b12x_core::Error::InvalidValue {
        op: OP,
        operand: operand.into(),
        expected: expected.into(),
        got: got.to_string(),
    })
}

fn check(l: &IndexerLaunch) -> Result<()> {
    if !SUPPORTED_TOPK.contains(&l.topk) {
        return Err(invalid("topk", format!("one of {SUPPORTED_TOPK:?}"), l.topk));
    }
    if l.heads == 0 || l.heads > MAX_HEADS {
        return Err(invalid("heads", format!("1..={MAX_HEADS}"), l.heads));
    }
    if l.supertile == 0 || l.supertile % SUPERTILE_ALIGN != 0 {
        let expected = format!("a positive multiple of {SUPERTILE_ALIGN}");
        return Err(invalid("supertile", expected, l.supertile));
    }
    let max_slices = l.supertile / SUPERTILE_ALIGN;
    if l.topk_slices == 0 || l.topk_slices > max_slices {
        return Err(invalid("topk_slices", format!("1..={max_slices}"), l.topk_slices));
    }
    if l.rows > l.rows_cap {
        return Err(invalid("rows", format!("<= rows_cap {}", l.rows_cap), l.rows));
    }
    if l.page_stride < PAGE_BYTES {
        return Err(invalid("page_stride", format!(">= {PAGE_BYTES} bytes"), l.page_stride));
    }
    if l.width as u64 * PAGE_ROWS as u64 > i32::MAX as u64 {
        let expected = format!("<= {} pages (int32 positions)", i32::MAX as u32 / PAGE_ROWS);
        return Err(invalid("width", expected, l.width));
    }
    let required = [
        ("q", l.q),
        ("weights", l.weights),
        ("kcache", l.kcache),
        ("page_table", l.page_table),
        ("lengths", l.lengths),
        ("active_width", l.active_width),
        ("out_indices", l.out_indices),
        ("logits", l.logits),
        ("carry_values", l.carry_values),
        ("carry_indices", l.carry_indices),
    ];
    for (name, ptr) in required {
        if ptr == 0 {
            return Err(invalid(name, "a device pointer".into(), "null"));
        }
    }
    if l.topk_slices > 1 && (l.partial_values == 0 || l.partial_indices == 0) {
        let expected = "the partial regions when topk_slices > 1".to_string();
        return Err(invalid("partial_values", expected, "null"));
    }
    Ok(())
}

/// Scorer kernels by route, MMA flavor (enum order) and heads / 16 (16..64).
const SCORERS: [[[Kernel; 4]; 3]; 2] = {
    use Kernel::*;
    [
        [
            [
                IndexerDecodeE4m3H16,
                IndexerDecodeE4m3H32,
                IndexerDecodeE4m3H48,
                IndexerDecodeE4m3H64,
            ],
            [IndexerDecodeF16H16, IndexerDecodeF16H32, IndexerDecodeF16H48, IndexerDecodeF16H64],
            [
                IndexerWgmmaDecodeH16,
                IndexerWgmmaDecodeH32,
                IndexerWgmmaDecodeH48,
                IndexerWgmmaDecodeH64,
            ],
        ],
        [
            [
                IndexerPrefillE4m3H16,
                IndexerPrefillE4m3H32,
                IndexerPrefillE4m3H48,
                IndexerPrefillE4m3H64,
            ],
            [
                IndexerPrefillF16H16,
                IndexerPrefillF16H32,
                IndexerPrefillF16H48,
                IndexerPrefillF16H64,
            ],
            [
                IndexerWgmmaPrefillH16,
                IndexerWgmmaPrefillH32,
                IndexerWgmmaPrefillH48,
                IndexerWgmmaPrefillH64,
            ],
        ],
    ]
};

fn scorer(route: Route, flavor: MmaFlavor, heads: u32) -> Kernel {
    let tile = heads.div_ceil(16).clamp(1, 4) as usize - 1;
    SCORERS[route as usize][flavor as usize][tile]
}

/// Pages per CTA and launch shape of the scorer: static shapes only.
fn scorer_config(l: &IndexerLaunch, flavor: MmaFlavor, sms: u32) -> (u32, LaunchConfig) {
    let s = l.supertile;
    let chunk_pages = s / PAGE_ROWS;
    let heads_padded = l.heads.div_ceil(16) * 16;
    match (l.route, flavor) {
        (Route::PagedDecode, MmaFlavor::Wgmma) => {
            let ppc = decode_pages_per_cta(l.rows, s, sms);
            let shared_bytes = wgmma_shared_bytes(heads_padded, 1);
            let grid = (l.rows, chunk_pages.div_ceil(ppc), 1);
            (ppc, LaunchConfig { grid, block: (WGMMA_THREADS, 1, 1), shared_bytes })
        }
        (Route::SharedPrefill, MmaFlavor::Wgmma) => {
            let ppc = wgmma_prefill_pages_per_cta(l.rows, s, sms);
            let shared_bytes = wgmma_shared_bytes(heads_padded, WGMMA_PREFILL_ROWS);
            let grid = (l.rows.div_ceil(WGMMA_PREFILL_ROWS), chunk_pages.div_ceil(ppc), 1);
            (ppc, LaunchConfig { grid, block: (WGMMA_THREADS, 1, 1), shared_bytes })
        }
        (Route::PagedDecode, _) => {
            let ppc = decode_pages_per_cta(l.rows, s, sms);
            let grid = (l.rows, chunk_pages.div_ceil(ppc), 1);
            (ppc, LaunchConfig { grid, block: (DECODE_THREADS, 1, 1), shared_bytes: 0 })
        }
        (Route::SharedPrefill, _) => {
            let grid = (s / PREFILL_TOKENS, l.rows.div_ceil(PREFILL_ROWS), 1);
            (0, LaunchConfig { grid, block: (PREFILL_THREADS, 1, 1), shared_bytes: 0 })
        }
    }
}

/// Enqueues the whole indexer call on `l.stream`: no allocation, no sync.
/// A call with zero rows enqueues nothing.
///
/// # Safety
/// Every pointer in `l` must be a device pointer on `l.device` valid for the
/// accesses its documented shape implies (the K cache for every page id the
/// live part of the page table names), the scratch regions must not overlap
/// each other or the operands, and `l.stream` must belong to `l.device`.
pub unsafe fn launch_indexer(l: &IndexerLaunch) -> Result<()> {
    check(l)?;
    if l.rows == 0 {
        return Ok(());
    }
    let modules = loaded(l.device)?;
    let flavor =
        l.flavor.unwrap_or_else(|| MmaFlavor::for_compute_capability(modules.compute_capability));
    let sms = modules.multiprocessors;
    let s = l.supertile;
    let chunks = num_chunks(l.width, s).max(1);
    let score_kernel = scorer(l.route, flavor, l.heads);
    let (pages_per_cta, score_config) = scorer_config(l, flavor, sms);
    let slices = l.topk_slices;
    let mut tp = TopkParams {
        logits: l.logits,
        lengths: l.lengths,
        active_width: l.active_width,
        page_table: l.page_table,
        carry_values: l.carry_values,
        carry_indices: l.carry_indices,
        part_values: l.partial_values,
        part_indices: l.partial_indices,
        out_indices: l.out_indices,
        out_scores: l.out_scores,
        logits_row_stride: s as u64,
        pt_row_stride: l.page_table_row_stride,
        carry_half_stride: l.rows_cap as u64 * l.topk as u64,
        rows: l.rows,
        width: l.width,
        topk: l.topk,
        chunk: 0,
        num_chunks: chunks,
        chunk_len: s,
        slices,
        slice_len: slice_len(s, slices),
        physical: l.physical as u32,
        pages: kernel_pages(l.pages),
    };
    let topk_block = (TOPK_THREADS, 1, 1);
    for c in 0..chunks {
        let mut sp = ScoreParams {
            q: l.q,
            weights: l.weights,
            kcache: l.kcache,
            page_table: l.page_table,
            lengths: l.lengths,
            active_width: l.active_width,
            logits: l.logits,
            status: modules.status,
            page_stride: l.page_stride,
            pt_row_stride: l.page_table_row_stride,
            logits_row_stride: s as u64,
            rows: l.rows,
            heads: l.heads,
            width: l.width,
            chunk_start: c * s,
            chunk_len: s,
            pages_per_cta,
            pages: kernel_pages(l.pages),
            pad: 0,
        };
        let mut args = [std::ptr::addr_of_mut!(sp) as *mut c_void];
        // SAFETY: ScoreParams mirrors the kernels' parameter struct; pointer
        // validity is the caller's contract.
        unsafe { launch(l.device, score_kernel, score_config, l.stream, &mut args)? };
        tp.chunk = c;
        let mut targs = [std::ptr::addr_of_mut!(tp) as *mut c_void];
        if slices == 1 {
            let cfg = LaunchConfig { grid: (l.rows, 1, 1), block: topk_block, shared_bytes: 0 };
            // SAFETY: as above, TopkParams mirrors the kernels' struct.
            unsafe { launch(l.device, Kernel::IndexerTopkFold, cfg, l.stream, &mut targs)? };
        } else {
            let cfg =
                LaunchConfig { grid: (l.rows, slices, 1), block: topk_block, shared_bytes: 0 };
            // SAFETY: as above.
            unsafe { launch(l.device, Kernel::IndexerTopkSlice, cfg, l.stream, &mut targs)? };
            let cfg = LaunchConfig { grid: (l.rows, 1, 1), block: topk_block, shared_bytes: 0 };
            // SAFETY: as above.
            unsafe { launch(l.device, Kernel::IndexerTopkMerge, cfg, l.stream, &mut targs)? };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn param_structs_match_the_kernels_layout() {
        // 11 u64 + 8 u32 and 13 u64 + 10 u32 (kernels/indexer_common.cuh, indexer_topk.cu).
        assert_eq!(std::mem::size_of::<ScoreParams>(), 11 * 8 + 8 * 4);
        assert_eq!(std::mem::size_of::<TopkParams>(), 13 * 8 + 10 * 4);
    }

    #[test]
    fn chunk_and_slice_arithmetic() {
        assert_eq!(num_chunks(512, 32768), 1);
        assert_eq!(num_chunks(513, 32768), 2);
        assert_eq!(num_chunks(2048, 32768), 4);
        assert_eq!(num_chunks(1, 512), 1);
        assert_eq!(slice_len(131072, 32), 4096);
        assert_eq!(slice_len(1536, 2), 1024);
        assert_eq!(slice_len(1024, 2), 512);
    }

    #[test]
    fn decode_cta_split_is_static_and_bounded() {
        assert_eq!(decode_pages_per_cta(64, 32768, 132), 32);
        assert_eq!(decode_pages_per_cta(1, 131072, 132), DECODE_WARPS);
        assert_eq!(decode_pages_per_cta(4096, 32768, 132), DECODE_MAX_PAGES_PER_CTA);
    }

    #[test]
    fn wgmma_shapes() {
        // 64 heads: 4 x 8 KiB ring + f16 Q + 1 KiB scales + weights + ids + 1 KiB alignment.
        assert_eq!(wgmma_shared_bytes(64, 1), 32768 + 16384 + 1024 + 320 + 16 + 1024);
        assert_eq!(wgmma_shared_bytes(64, 4), 32768 + 65536 + 1024 + 1088 + 16 + 1024);
        // 1024 row blocks fill the SMs: one split; 16 row blocks: the chunk is split.
        assert_eq!(wgmma_prefill_pages_per_cta(4096, 32768, 132), 512);
        assert_eq!(wgmma_prefill_pages_per_cta(64, 32768, 132), 16);
        assert_eq!(wgmma_prefill_pages_per_cta(1, 512, 132), 1);
    }

    #[test]
    fn scorer_table_matches_route_flavor_and_heads() {
        let flavors =
            [(MmaFlavor::E4m3, "e4m3"), (MmaFlavor::F16, "f16"), (MmaFlavor::Wgmma, "wgmma")];
        for (route, name) in [(Route::PagedDecode, "decode"), (Route::SharedPrefill, "prefill")] {
            for (flavor, tag) in flavors {
                for (heads, tile) in [(1, 16), (16, 16), (17, 32), (48, 48), (64, 64)] {
                    let symbol = scorer(route, flavor, heads).symbol();
                    let flavor_first = flavor == MmaFlavor::Wgmma;
                    let expected = if flavor_first {
                        format!("b12x_indexer_{tag}_{name}_h{tile}")
                    } else {
                        format!("b12x_indexer_{name}_{tag}_h{tile}")
                    };
                    assert_eq!(symbol, expected);
                }
            }
        }
    }

    #[test]
    fn flavor_by_arch() {
        assert_eq!(MmaFlavor::for_compute_capability((9, 0)), MmaFlavor::Wgmma);
        assert_eq!(MmaFlavor::for_compute_capability((12, 0)), MmaFlavor::E4m3);
        assert_eq!(MmaFlavor::for_compute_capability((8, 9)), MmaFlavor::E4m3);
        assert_eq!(MmaFlavor::for_compute_capability((10, 0)), MmaFlavor::F16);
    }

    fn sample() -> IndexerLaunch {
        IndexerLaunch {
            device: 0,
            stream: 0,
            route: Route::PagedDecode,
            physical: false,
            flavor: None,
            rows: 2,
            heads: 64,
            width: 16,
            topk: 512,
            supertile: 1024,
            topk_slices: 1,
            rows_cap: 2,
            q: 1,
            weights: 1,
            kcache: 1,
            page_stride: PAGE_BYTES,
            page_table: 1,
            page_table_row_stride: 16,
            pages: 64,
            lengths: 1,
            active_width: 1,
            out_indices: 1,
            out_scores: 0,
            logits: 1,
            carry_values: 1,
            carry_indices: 1,
            partial_values: 0,
            partial_indices: 0,
        }
    }

    #[test]
    fn bad_launches_are_refused_with_the_reason() {
        assert!(check(&sample()).is_ok());
        type Mutation = fn(&mut IndexerLaunch);
        let cases: [(Mutation, &str); 7] = [
            (|l| l.topk = 4, "topk expected one of"),
            (|l| l.heads = 65, "heads expected"),
            (|l| l.supertile = 1000, "supertile expected"),
            (|l| l.topk_slices = 3, "topk_slices expected"),
            (|l| l.page_stride = 8447, "page_stride expected"),
            (|l| l.rows = 3, "rows expected"),
            (|l| l.topk_slices = 2, "partial regions"),
        ];
        for (mutate, msg) in cases {
            let mut l = sample();
            mutate(&mut l);
            let err = check(&l).expect_err(msg).to_string();
            assert!(err.contains(msg), "{err}");
        }
    }
}
