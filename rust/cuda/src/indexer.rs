//! Launchers for the C4 indexer kernels (kernels/indexer_*.cu).
//!
//! One call enqueues, per supertile chunk of the page table, a scorer
//! (paged decode, or prefill over a shared page-table row) and the exact
//! top-k fold over that chunk and the carry; one-chunk decode on Hopper
//! selects with a cluster of CTAs per row instead, or with a grid of them
//! for few long rows. It launches straight from a
//! core [`Binding`]: `Caps`, `Plan` and `bind` validated every value, the plan
//! chose the route, the MMA flavor, the supertile and the top-k slices, so
//! nothing is checked again here (debug builds assert the invariants).
//! Grids depend only on the static shapes and the device's SM count, never on
//! device values, so the sequence is safe to capture in a CUDA graph.

use std::ffi::c_void;

use b12x_core::indexer::{
    Binding, IndexSpace, MmaFlavor, PageFault, Plan, RegionId, Route, Stages,
    GRID_SELECT_MIN_PARTS, HEAD_DIM, MAX_HEADS, PAGE_BYTES, PAGE_SIZE, SCALE_OFFSET,
    SELECT_CANDIDATES, SELECT_STATE_WORDS, STATUS_WORDS, SUPERTILE_QUANTUM, SUPPORTED_TOPK,
    TMA_MAX_ROW_BLOCKS, TMA_PREFILL_BLOCK_ROWS,
};
use b12x_core::Device;
use cudarc::driver::sys;

use crate::device::{loaded, with_context, DeviceModules, STATUS_BYTES};
use crate::error::{CudaError, DriverContext, Result};
use crate::launch::{launch, memset_u32, LaunchConfig};
use crate::ptx::Kernel;
use crate::tma::{Element, TensorMap, Tiled};

// Host mirrors of the kernels' tile constants (pinned by a test against the
// kernel sources, `kernel_constants_match_the_sources`).
const DECODE_WARPS: u32 = 4;
const DECODE_THREADS: u32 = DECODE_WARPS * 32;
const DECODE_MAX_PAGES_PER_CTA: u32 = 256;
const PREFILL_WARPS: u32 = 8;
const PREFILL_THREADS: u32 = PREFILL_WARPS * 32;
/// Tokens of one prefill CTA; supertiles are whole multiples of it.
const PREFILL_TOKENS: u32 = 512;
const PREFILL_ROWS: u32 = 64;
const TOPK_THREADS: u32 = 1024;
const TOPK_STREAM_THREADS: u32 = 512;
/// The stream kernel's CTAs an SM (its launch bounds; 64 registers a thread).
const TOPK_STREAM_CTAS: u32 = 2;
/// The wgmma scorers (kernels/indexer_wgmma.cu): one warpgroup per CTA.
const WGMMA_THREADS: u32 = 128;
/// K ring depth of the decode and prefill wgmma scorers (WG_*_STAGES).
const WGMMA_DECODE_STAGES: u32 = 4;
const WGMMA_PREFILL_STAGES: u32 = 4;
const WGMMA_PREFILL_ROWS: u32 = 4;
/// Resident wgmma prefill CTAs per SM (register-bound at 64 heads).
const WGMMA_PREFILL_CTAS_PER_SM: u32 = 2;
/// The TMA-fed scorers (kernels/indexer_hopper.cu): a producer warpgroup and
/// four (exact decode) or two (prefill) consumer warpgroups per CTA, K rings
/// of these depths.
const HOPPER_DECODE_THREADS: u32 = 640;
const HOPPER_PREFILL_THREADS: u32 = 384;
const HOPPER_DECODE_STAGES: u32 = 16;
const HOPPER_PREFILL_STAGES: u32 = 8;
/// The fast (FP8) decode scorer runs two CTAs an SM, each a producer
/// warpgroup, two consumer warpgroups and a ring of 8 stages.
const HOPPER_FAST_DECODE_THREADS: u32 = 384;
const HOPPER_FAST_DECODE_STAGES: u32 = 8;
const HOPPER_FAST_DECODE_CTAS_PER_SM: u32 = 2;
/// Query rows of one part of a prefill page's MMAs (HP_PREFILL_PART_ROWS), and
/// the e4m3 levels of each row's linear part (HP_LIN_LEVELS): B rows the
/// consumers write after the part's Q.
const HOPPER_PREFILL_PART_ROWS: u32 = 2;
const HOPPER_LIN_LEVELS: u32 = 4;

/// Dynamic shared memory of a wgmma scorer CTA: the FP8 K ring, the rows' Q
/// (as f16, or as FP8 for the fast flavor), the ring's scales, the weights
/// (by lane, padded by 4 pairs per lane), and the ring's page ids, plus 1 KiB
/// to align the base (mirrors `WgSmem` in kernels/indexer_wgmma.cu; the
/// kernel traps if given less).
pub fn wgmma_shared_bytes(heads_padded: u32, rows: u32, fp8: bool) -> u32 {
    let n = heads_padded * rows;
    let stages = if rows == 1 { WGMMA_DECODE_STAGES } else { WGMMA_PREFILL_STAGES };
    let q_bytes = if fp8 { 1 } else { 2 };
    stages * PAGE_SIZE * HEAD_DIM
        + n * HEAD_DIM * q_bytes
        + stages * PAGE_SIZE * 4
        + (n + 16) * 4
        + stages * 4
        + 1024
}

/// Pages one wgmma prefill CTA scores: the whole chunk when the row blocks
/// alone fill two waves of resident CTAs, else the chunk split so they do.
pub fn wgmma_prefill_pages_per_cta(rows: u32, supertile: u32, multiprocessors: u32) -> u32 {
    let chunk_pages = (supertile / PAGE_SIZE).max(1);
    let row_blocks = rows.div_ceil(WGMMA_PREFILL_ROWS).max(1);
    let target = 2 * WGMMA_PREFILL_CTAS_PER_SM * multiprocessors.max(1);
    let splits = target.div_ceil(row_blocks).clamp(1, chunk_pages);
    chunk_pages.div_ceil(splits)
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
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
    /// Words of `zero` the scorer clears (the grid selection's row state).
    zero_words: u32,
    zero: u64,
}

/// Parameters of the TMA-fed scorers (`HopperParams` in
/// kernels/indexer_hopper.cu): three tensor maps, then the common block.
#[repr(C)]
struct HopperParams {
    k_map: TensorMap,
    scale_map: TensorMap,
    q_map: TensorMap,
    s: ScoreParams,
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
    stage_cap: u32,
    hit_cap: u32,
}

/// Parameters of the cluster and grid selections (`SelectParams` in
/// kernels/indexer_select.cu).
#[repr(C)]
struct SelectParams {
    logits: u64,
    lengths: u64,
    active_width: u64,
    page_table: u64,
    out_indices: u64,
    out_scores: u64,
    logits_row_stride: u64,
    pt_row_stride: u64,
    rows: u32,
    width: u32,
    topk: u32,
    physical: u32,
    pages: u32,
    /// 1 when the selection's programmatic primary is this call's own scorer
    /// or clearing kernel (both launched without the attribute): the kernel
    /// then loads the lengths before its `griddepcontrol.wait`.
    lengths_settled: u32,
    /// The grid selection's row state and candidates (unused by the cluster
    /// selection).
    state: u64,
    cand: u64,
}

/// Threads of a cluster-selection CTA and the most logits each holds.
const SELECT_THREADS: u32 = 1024;
const SELECT_MAX_PER_THREAD: u32 = 16;
const SELECT_MAX_CLUSTER: u32 = 8;

/// The cluster shape for `rows` rows of `supertile` logits on `sms` SMs:
/// (CTAs per row, logits per thread). One CTA per SM (1024 threads at 56-64
/// registers); clusters grow while every row's cluster still fits one wave.
pub fn select_shape(rows: u32, supertile: u32, sms: u32) -> (u32, u32) {
    let per_cta = SELECT_THREADS * SELECT_MAX_PER_THREAD;
    let mut cluster = supertile.div_ceil(per_cta).max(1).next_power_of_two();
    while cluster < SELECT_MAX_CLUSTER && rows as u64 * 2 * cluster as u64 <= sms as u64 {
        cluster *= 2;
    }
    let per = supertile.div_ceil(cluster * SELECT_THREADS).next_power_of_two().max(4);
    (cluster, per)
}

/// Most CTAs of one row's grid selection (`SG_MAX_PARTS`), and the fewest.
/// On one H200 (the top-k alone, bench-results/h200/indexer-round10-notes.md):
/// at 2 CTAs a row (64 rows x 32768 logits) the cluster selection was faster
/// than a first grid form (22.2 against 28.7 us), at 8 (16 x 65536) it was
/// much slower (37.2 against 23.7).
/// (The fewest is `GRID_SELECT_MIN_PARTS`, in core: the plan sizes the row
/// state by it.)
const GRID_SELECT_MAX_PARTS: u32 = 128;

/// Dynamic shared memory of a grid-selection CTA: the row's last CTA copies
/// the candidates there. With the kernel's 8 KiB of static shared memory a
/// CTA takes more than half of a Hopper SM's 228 KiB, which also keeps the
/// grid at one CTA per SM (two fitted at 32 registers, and measured 2 us
/// slower for one row of 131072 logits).
const GRID_SELECT_SHARED_BYTES: u32 = SELECT_CANDIDATES as u32 * 8;

/// Candidates a cluster selection's rank 0 gathers in its shared memory
/// (`SC_CAND_CAP`): the k-th key's level-0 bin when it holds no more (a few
/// hundred of 32768 bench logits); a bigger bin takes two more levels.
const CLUSTER_SELECT_CANDIDATES: u32 = 4096;
const CLUSTER_SELECT_SHARED_BYTES: u32 = CLUSTER_SELECT_CANDIDATES * 8;

// On an H200 (227 KiB a CTA, 228 KiB an SM with 1 KiB reserved per CTA),
// with the kernels' static shared memory (ptxas: 8336 B grid, 24736 B
// cluster): both pools fit, and two grid-selection CTAs do not fit one SM.
const _: () = {
    const OPT_IN: u32 = 232448;
    const SM: u32 = 233472;
    let grid_cta = GRID_SELECT_SHARED_BYTES + 8336;
    assert!(grid_cta <= OPT_IN && 2 * (grid_cta + 1024) > SM);
    assert!(CLUSTER_SELECT_SHARED_BYTES + 24736 <= OPT_IN);
};

/// The grid selection's shape for `rows` rows of `supertile` logits on `sms`
/// SMs: (CTAs per row, logits per thread), the most CTAs (the fewest logits
/// per thread) whose grid fits one wave of one CTA per SM, which its row
/// barriers need; `None` when no shape fits or a row would take fewer than
/// `GRID_SELECT_MIN_PARTS` CTAs at 4 logits a thread.
///
/// 2 a thread (`gselect_p2`) only doubles the CTAs of rows that take the grid
/// at 4: a decode call of one row of 131072 logits took about 0.45 us less
/// over 64 CTAs than over 32 on an H200 (0.2-0.25 on an H100), and at 1 a
/// thread over 128 it was no faster (bench-results/h200/indexer-round32-notes.md).
pub fn grid_select_shape(rows: u32, supertile: u32, sms: u32) -> Option<(u32, u32)> {
    let fits =
        |parts: u32| parts <= GRID_SELECT_MAX_PARTS && rows as u64 * parts as u64 <= sms as u64;
    let (parts, per) = [4, 8, 16].into_iter().find_map(|per| {
        let parts = supertile.div_ceil(SELECT_THREADS * per);
        (parts >= GRID_SELECT_MIN_PARTS && fits(parts)).then_some((parts, per))
    })?;
    Some(if per == 4 && fits(2 * parts) { (2 * parts, 2) } else { (parts, per) })
}

fn grid_select_kernel(per: u32) -> Kernel {
    match per {
        2 => Kernel::IndexerGridSelectP2,
        4 => Kernel::IndexerGridSelectP4,
        8 => Kernel::IndexerGridSelectP8,
        _ => Kernel::IndexerGridSelectP16,
    }
}

/// Threads of a `b12x_indexer_zero_state` CTA (`IDX_ZERO_STATE_THREADS`, its
/// launch bound).
const ZERO_STATE_THREADS: u32 = 128;

fn select_kernel(per: u32) -> Kernel {
    match per {
        4 => Kernel::IndexerSelectP4,
        8 => Kernel::IndexerSelectP8,
        _ => Kernel::IndexerSelectP16,
    }
}

// Shared-memory layout of the top-k kernels (kernels/indexer_topk.cu, pinned
// by `kernel_constants_match_the_sources` and the kernels' static_asserts).
const TOPK_STAGED_SMEM: u32 = 16560; // StagedSmem
const TOPK_GENERAL_SMEM: u32 = 41240; // TopkSmem, the general paths
const STAGED_HIT_MAX: u32 = 8192;
/// The stream kernel's level-1 refine counts: 4096 bins and their sums by 32.
const TOPK_STREAM_SUB_BINS: u32 = 4096;
const TOPK_STREAM_SUB_SMEM: u32 = 4 * (TOPK_STREAM_SUB_BINS + TOPK_STREAM_SUB_BINS / 32);
/// Shared memory the driver reserves for each CTA (sm_80 and later).
const SHARED_RESERVED_PER_CTA: u32 = 1024;

/// Dynamic shared memory of a top-k kernel whose stage holds `stage_cap`
/// candidates (raw fp32 bits, or 16-bit key prefixes) and whose hit list holds
/// `hit_cap` positions (mirrors `staged_bytes` in kernels/indexer_topk.cu).
pub fn topk_shared_bytes(raw: bool, hit_cap: u32, stage_cap: u32) -> u32 {
    let per = if raw { 4 } else { 2 };
    (TOPK_STAGED_SMEM + 12 * hit_cap + per * stage_cap).max(TOPK_GENERAL_SMEM)
}

/// One top-k kernel launch: its stage and hit list within the device's
/// shared memory, or none (stage_cap 0: the general paths only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopkStage {
    /// The staged kernels: candidates staged. The stream kernel, which stages
    /// none: its level-1 refine bins, or 0 (see `topk_stream_stage`).
    pub stage_cap: u32,
    pub hit_cap: u32,
    pub shared_bytes: u32,
}

impl TopkStage {
    /// No stage: the general paths only, in their own shared memory.
    pub const GENERAL: TopkStage =
        TopkStage { stage_cap: 0, hit_cap: 0, shared_bytes: TOPK_GENERAL_SMEM };
}

/// The stage for `candidates` positions: the hit list at 2 topk + 1024
/// (about twice what the sampled threshold lists), shrunk down to topk + 512
/// to fit `opt_in` bytes, else no stage.
pub fn topk_stage(raw: bool, topk: u32, candidates: u32, opt_in: u32) -> TopkStage {
    let per = if raw { 4 } else { 2 };
    let want = (2 * topk + 1024).min(STAGED_HIT_MAX);
    let room = (opt_in.saturating_sub(TOPK_STAGED_SMEM + per * candidates) / 12) & !3;
    let hit_cap = want.min(room);
    if hit_cap < topk + 512 {
        return TopkStage::GENERAL;
    }
    let shared_bytes = topk_shared_bytes(raw, hit_cap, candidates);
    TopkStage { stage_cap: candidates, hit_cap, shared_bytes }
}

/// Dynamic shared memory of the stream kernel with a `cap`-entry buffer, and
/// the level-1 counts where `sub` (mirrors `stream_bytes` in
/// kernels/indexer_topk.cu).
pub fn topk_stream_shared_bytes(cap: u32, sub: bool) -> u32 {
    let sub_bytes = if sub { TOPK_STREAM_SUB_SMEM } else { 0 };
    (TOPK_STAGED_SMEM + sub_bytes + 8 * cap).max(TOPK_GENERAL_SMEM)
}

/// The stream kernel's buffer (in `hit_cap`): 5 topk + 1024 entries, 1.3-1.6x
/// what a bound raised after rounds 1, 2, 4, ... kept on 32768-token rows in
/// a replay of its rounds (2.0-2.3k keys of a top-512, 7.6-8.6k of a
/// top-2048; the kernel now raises it every round, which keeps fewer). At the
/// end the keys of the k-th key's bin are copied behind the kept ones; a row
/// whose keys and that copy do not fit takes the radix path. Shrunk to fit
/// `opt_in` bytes; none below topk + 512.
///
/// Where the whole buffer and level 1's counts of the refine of that bin
/// (`stage_cap` = their 4096 bins, 16.5 KiB) still leave an SM its two CTAs
/// (both H100 and H200 at top-512 and top-1024), the kernel counts level 1
/// as it copies the bin's keys and decides it without a barrier; else
/// (`stage_cap` 0: top-2048 on Hopper, sm_120) it counts level 1 after one.
pub fn topk_stream_stage(topk: u32, opt_in: u32, per_sm: u32) -> Option<TopkStage> {
    let full = 5 * topk + 1024;
    let with_sub = topk_stream_shared_bytes(full, true);
    if with_sub <= opt_in && TOPK_STREAM_CTAS * (with_sub + SHARED_RESERVED_PER_CTA) <= per_sm {
        return Some(TopkStage {
            stage_cap: TOPK_STREAM_SUB_BINS,
            hit_cap: full,
            shared_bytes: with_sub,
        });
    }
    let room = (opt_in.saturating_sub(TOPK_STAGED_SMEM) / 8) & !3;
    let cap = full.min(room);
    let shared_bytes = topk_stream_shared_bytes(cap, false);
    (cap >= topk + 512 && shared_bytes <= opt_in).then_some(TopkStage {
        stage_cap: 0,
        hit_cap: cap,
        shared_bytes,
    })
}

/// The fold kernel for `rows` rows of `candidates` positions each. More rows
/// than SMs: the stream kernel (one read, no candidate stage, two CTAs per SM).
/// Else, each row on an SM of its own: the raw fp32 stage, else the 16-bit
/// prefix stage (half the shared memory), else the general paths.
pub fn topk_fold_kernel(
    rows: u32,
    topk: u32,
    candidates: u32,
    sms: u32,
    opt_in: u32,
    per_sm: u32,
) -> (Kernel, TopkStage) {
    if rows > sms {
        if let Some(stage) = topk_stream_stage(topk, opt_in, per_sm) {
            return (Kernel::IndexerTopkStream, stage);
        }
    }
    let raw = topk_stage(true, topk, candidates, opt_in);
    let prefix = topk_stage(false, topk, candidates, opt_in);
    if raw.stage_cap != 0 || prefix.stage_cap == 0 {
        (Kernel::IndexerTopkFold, raw)
    } else {
        (Kernel::IndexerTopkFoldPrefix, prefix)
    }
}

/// Threads of a top-k kernel's CTA (kernels/indexer_topk.cu).
fn topk_block(kernel: Kernel) -> u32 {
    if kernel == Kernel::IndexerTopkStream {
        TOPK_STREAM_THREADS
    } else {
        TOPK_THREADS
    }
}

/// Chunks the page table is scored in: ceil(width * 64 / supertile).
pub fn num_chunks(width: u32, supertile: u32) -> u32 {
    ((width as u64 * PAGE_SIZE as u64).div_ceil(supertile.max(1) as u64)) as u32
}

/// Tokens per top-k slice: the supertile split into `slices` parts, rounded
/// up to 512 (slices start 16-byte aligned; trailing slices may be empty).
pub fn slice_len(supertile: u32, slices: u32) -> u32 {
    supertile.div_ceil(slices.max(1)).next_multiple_of(SUPERTILE_QUANTUM)
}

/// Pages one decode CTA scores: about eight CTAs' worth of work per SM
/// across all rows (a few waves, so uneven live lengths even out), at least
/// one page per warp.
pub fn decode_pages_per_cta(rows: u32, supertile: u32, multiprocessors: u32) -> u32 {
    let pages = (supertile / PAGE_SIZE) as u64 * rows.max(1) as u64;
    let target_ctas = multiprocessors.max(1) as u64 * 8;
    (pages.div_ceil(target_ctas) as u32).clamp(DECODE_WARPS, DECODE_MAX_PAGES_PER_CTA)
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

/// Scorer kernels by route, MMA flavor (enum order) and heads / 16 (16..64).
const SCORERS: [[[Kernel; 4]; 6]; 2] = {
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
            [
                IndexerWgmmaFp8DecodeH16,
                IndexerWgmmaFp8DecodeH32,
                IndexerWgmmaFp8DecodeH48,
                IndexerWgmmaFp8DecodeH64,
            ],
            [
                IndexerTmaFp8DecodeH16,
                IndexerTmaFp8DecodeH32,
                IndexerTmaFp8DecodeH48,
                IndexerTmaFp8DecodeH64,
            ],
            [
                IndexerTmaF16DecodeH16,
                IndexerTmaF16DecodeH32,
                IndexerTmaF16DecodeH48,
                IndexerTmaF16DecodeH64,
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
            [
                IndexerWgmmaFp8PrefillH16,
                IndexerWgmmaFp8PrefillH32,
                IndexerWgmmaFp8PrefillH48,
                IndexerWgmmaFp8PrefillH64,
            ],
            [
                IndexerTmaFp8PrefillH16,
                IndexerTmaFp8PrefillH32,
                IndexerTmaFp8PrefillH48,
                IndexerTmaFp8PrefillH64,
            ],
            [
                IndexerTmaF16PrefillH16,
                IndexerTmaF16PrefillH32,
                IndexerTmaF16PrefillH48,
                IndexerTmaF16PrefillH64,
            ],
        ],
    ]
};

fn scorer(route: Route, flavor: MmaFlavor, heads: u32) -> Kernel {
    let tile = heads.div_ceil(16).clamp(1, 4) as usize - 1;
    SCORERS[route as usize][flavor as usize][tile]
}

/// The MMA flavors whose scorers are loaded on `ordinal` (their module's
/// target runs there): what a plan may be forced to.
pub fn available_flavors(ordinal: u32) -> Result<Vec<MmaFlavor>> {
    Ok(flavors_in(loaded(ordinal)?))
}

fn flavors_in(modules: &DeviceModules) -> Vec<MmaFlavor> {
    let loaded = |f| {
        [Route::PagedDecode, Route::SharedPrefill]
            .iter()
            .all(|&r| (16..=MAX_HEADS).step_by(16).all(|h| modules.has(scorer(r, f, h))))
    };
    MmaFlavor::ALL.into_iter().filter(|&f| loaded(f)).collect()
}

/// How a scorer's grid follows the live rows (everything else about its
/// launch is fixed by the plan).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScorerGrid {
    /// One CTA per (row, span of pages) (indexer_decode.cu, the wgmma decode).
    DecodeRows { block: u32, shared_bytes: u32 },
    /// One CTA per (block of 4 rows, span of pages) (the wgmma prefill).
    WgmmaPrefill { shared_bytes: u32 },
    /// One CTA per (512 tokens, 64 rows) (indexer_prefill.cu).
    PrefillTiles,
    /// Persistent CTAs, `ctas_per_sm` an SM of `threads` threads, fed by TMA
    /// (indexer_hopper.cu).
    Tma { shared_bytes: u32, heads_padded: u32, block_rows: u32, threads: u32, ctas_per_sm: u32 },
}

/// What a plan launches, resolved when the plan is made: the scorer and its
/// launch shape, the selection kernels and their shared memory. A launch
/// only fills the parameter blocks from a binding and enqueues.
#[derive(Debug, Clone)]
pub struct LaunchRecipe {
    status: u64,
    multiprocessors: u32,
    scorer: Kernel,
    grid: ScorerGrid,
    /// Fold kernels by live rows: at most one row per SM, or more.
    fold_few: (Kernel, TopkStage),
    fold_many: (Kernel, TopkStage),
    slices: u32,
    slice_len: u32,
    /// One-chunk decode on Hopper: the cluster selection (indexer_select.cu)
    /// instead of the fold.
    cluster_select: bool,
    /// One-chunk decode with few rows on Hopper (the plan's row state holds
    /// it): the grid selection, for calls whose rows fit `grid_select_shape`.
    grid_select: bool,
    /// `b12x_indexer_zero_state` is loaded (Hopper): a top-k-only call
    /// clears the grid selection's state with it, the selection its
    /// programmatic dependent, where other devices take a memset.
    zero_kernel: bool,
    physical: bool,
    stages: Stages,
}

/// Threads of a TMA-fed scorer CTA and its CTAs an SM: decode (one row a
/// block; the fast flavor two smaller CTAs an SM) or prefill.
pub fn hopper_shape(block_rows: u32, fast: bool) -> (u32, u32) {
    match (block_rows, fast) {
        (1, true) => (HOPPER_FAST_DECODE_THREADS, HOPPER_FAST_DECODE_CTAS_PER_SM),
        (1, false) => (HOPPER_DECODE_THREADS, 1),
        _ => (HOPPER_PREFILL_THREADS, 1),
    }
}

/// Query rows of a TMA scorer's Q load (one part of a block) and the B rows
/// the consumers add to each part: prefill parts of 2 rows, each with its
/// linear part's levels; decode one row, nothing added.
fn hopper_part(block_rows: u32) -> (u32, u32) {
    if block_rows == 1 {
        (1, 0)
    } else {
        (HOPPER_PREFILL_PART_ROWS, HOPPER_PREFILL_PART_ROWS * HOPPER_LIN_LEVELS)
    }
}

/// Dynamic shared memory of the exact TMA-fed scorers (mirrors `HpExactSmem`
/// in kernels/indexer_hopper.cu; the kernel traps if given less): the K ring
/// and its scales and ids, the f16 Q (256 bytes a head) and halved weights of
/// each group that stages them (prefill: each consumer warpgroup, its rows of
/// the block; decode: one, the row), the ring's barriers and the work scan.
pub fn hopper_exact_shared_bytes(heads_padded: u32, block_rows: u32) -> u32 {
    let stages = if block_rows == 1 { HOPPER_DECODE_STAGES } else { HOPPER_PREFILL_STAGES };
    let groups = if block_rows == 1 { 1 } else { HOPPER_PREFILL_THREADS / 128 - 1 };
    let n = block_rows / groups * heads_padded; // B rows of a group
    let q = groups * n * 2 * HEAD_DIM;
    let weights = groups * 4 * (n / 8 + 2) * 2 * 4;
    let k = stages * PAGE_SIZE * HEAD_DIM;
    let scales_and_ids = stages * (PAGE_SIZE * 4 + 4);
    let barriers = 2 * stages * 8;
    // the prefix, the warps' sums
    let scan = (TMA_MAX_ROW_BLOCKS + 1) * 4 + 32 * 4;
    k + q + scales_and_ids + weights + barriers + scan + 1024
}

/// Dynamic shared memory of the FP8 (fast) TMA-fed scorers, decode (two CTAs
/// an SM, `HOPPER_FAST_DECODE_STAGES`) or prefill (mirrors `HpSmem` in
/// kernels/indexer_hopper.cu; the kernel traps if given less).
pub fn hopper_shared_bytes(heads_padded: u32, block_rows: u32) -> u32 {
    let stages = if block_rows == 1 { HOPPER_FAST_DECODE_STAGES } else { HOPPER_PREFILL_STAGES };
    let (part_rows, lin) = hopper_part(block_rows);
    let q_stage = block_rows / part_rows * (part_rows * heads_padded + lin) * HEAD_DIM;
    let lin_scales = if lin == 0 { 0 } else { 2 * block_rows * HOPPER_LIN_LEVELS * 4 };
    let k = stages * PAGE_SIZE * HEAD_DIM;
    let scales_and_ids = stages * (PAGE_SIZE * 4 + 4) + lin_scales;
    let barriers = (2 * stages + 4) * 8;
    // the prefix, the warps' sums
    let scan = (TMA_MAX_ROW_BLOCKS + 1) * 4 + 32 * 4;
    k + 2 * q_stage + scales_and_ids + barriers + scan + 1024
}

impl LaunchRecipe {
    /// The recipe of `plan` on its device (whose modules must be loaded).
    pub fn new(plan: &Plan) -> Result<LaunchRecipe> {
        let Device::Cuda(ordinal) = plan.caps().device else {
            return Err(CudaError::Core(b12x_core::Error::Device {
                op: "plan",
                operand: "caps.device".into(),
                expected: Device::Cuda(0),
                got: plan.caps().device,
            }));
        };
        let modules = loaded(ordinal)?;
        // A CUDA plan always resolves a flavor (core's Plan::with_options).
        let flavor = plan.mma_flavor().unwrap_or(MmaFlavor::F16);
        let route = plan.route();
        let heads_padded = plan.heads_padded();
        let fp8 = flavor == MmaFlavor::WgmmaFp8;
        let grid = match (route, flavor) {
            (_, MmaFlavor::TmaFp8 | MmaFlavor::TmaF16) => {
                let block_rows =
                    if route == Route::PagedDecode { 1 } else { TMA_PREFILL_BLOCK_ROWS };
                let shared_bytes = if flavor == MmaFlavor::TmaF16 {
                    hopper_exact_shared_bytes(heads_padded, block_rows)
                } else {
                    hopper_shared_bytes(heads_padded, block_rows)
                };
                let (threads, ctas_per_sm) = hopper_shape(block_rows, flavor == MmaFlavor::TmaFp8);
                ScorerGrid::Tma { shared_bytes, heads_padded, block_rows, threads, ctas_per_sm }
            }
            (Route::PagedDecode, MmaFlavor::Wgmma | MmaFlavor::WgmmaFp8) => {
                let shared_bytes = wgmma_shared_bytes(heads_padded, 1, fp8);
                ScorerGrid::DecodeRows { block: WGMMA_THREADS, shared_bytes }
            }
            (Route::SharedPrefill, MmaFlavor::Wgmma | MmaFlavor::WgmmaFp8) => {
                let shared_bytes = wgmma_shared_bytes(heads_padded, WGMMA_PREFILL_ROWS, fp8);
                ScorerGrid::WgmmaPrefill { shared_bytes }
            }
            (Route::PagedDecode, _) => {
                ScorerGrid::DecodeRows { block: DECODE_THREADS, shared_bytes: 0 }
            }
            (Route::SharedPrefill, _) => ScorerGrid::PrefillTiles,
        };
        let (sms, opt_in) = (plan.multiprocessors(), modules.shared_opt_in);
        let (topk, s) = (plan.caps().topk, plan.supertile());
        // Candidates per fold CTA: the carry + the chunk.
        let fold =
            |rows| topk_fold_kernel(rows, topk, topk + s, sms, opt_in, modules.shared_per_sm);
        Ok(LaunchRecipe {
            status: modules.status,
            multiprocessors: sms,
            scorer: scorer(route, flavor, plan.caps().num_q_heads),
            grid,
            fold_few: fold(sms),
            fold_many: fold(sms + 1),
            slices: plan.topk_slices(),
            slice_len: slice_len(s, plan.topk_slices()),
            cluster_select: route == Route::PagedDecode
                && plan.max_chunks() == 1
                && s <= SELECT_MAX_CLUSTER * SELECT_THREADS * SELECT_MAX_PER_THREAD
                && modules.has(Kernel::IndexerSelectP4),
            grid_select: plan.grid_select_state() && modules.has(Kernel::IndexerGridSelectP4),
            zero_kernel: modules.has(Kernel::IndexerZeroState),
            physical: plan.caps().index_space == IndexSpace::Physical,
            stages: plan.stages(),
        })
    }

    /// The scorer's launch shape for `rows` live rows of a plan with
    /// `supertile`-token chunks, and the pages one CTA scores (grid scorers).
    fn scorer_launch(&self, rows: u32, supertile: u32) -> (u32, LaunchConfig) {
        let chunk_pages = supertile / PAGE_SIZE;
        let sms = self.multiprocessors;
        match self.grid {
            ScorerGrid::DecodeRows { block, shared_bytes } => {
                let ppc = decode_pages_per_cta(rows, supertile, sms);
                let grid = (rows, chunk_pages.div_ceil(ppc), 1);
                (
                    ppc,
                    LaunchConfig {
                        grid,
                        block: (block, 1, 1),
                        shared_bytes,
                        cluster: 1,
                        dependent: false,
                    },
                )
            }
            ScorerGrid::WgmmaPrefill { shared_bytes } => {
                let ppc = wgmma_prefill_pages_per_cta(rows, supertile, sms);
                let grid = (rows.div_ceil(WGMMA_PREFILL_ROWS), chunk_pages.div_ceil(ppc), 1);
                (
                    ppc,
                    LaunchConfig {
                        grid,
                        block: (WGMMA_THREADS, 1, 1),
                        shared_bytes,
                        cluster: 1,
                        dependent: false,
                    },
                )
            }
            ScorerGrid::PrefillTiles => {
                let grid = (supertile / PREFILL_TOKENS, rows.div_ceil(PREFILL_ROWS), 1);
                (
                    0,
                    LaunchConfig {
                        grid,
                        block: (PREFILL_THREADS, 1, 1),
                        shared_bytes: 0,
                        cluster: 1,
                        dependent: false,
                    },
                )
            }
            ScorerGrid::Tma { shared_bytes, threads, ctas_per_sm, .. } => {
                let grid = (sms * ctas_per_sm, 1, 1);
                (
                    0,
                    LaunchConfig {
                        grid,
                        block: (threads, 1, 1),
                        shared_bytes,
                        cluster: 1,
                        dependent: false,
                    },
                )
            }
        }
    }
}

/// What a call enqueues right before its one-chunk selection, which is
/// launched as that node's programmatic dependent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SelectPrimary {
    /// The call's own scorer (which also clears the grid selection's state).
    Scorer,
    /// A top-k-only grid selection's clearing kernel (Hopper).
    ZeroKernel,
    /// A top-k-only grid selection's state cleared by a memset node.
    Memset,
    /// A top-k-only cluster selection: the caller's last node.
    Caller,
}

impl SelectPrimary {
    fn of(scores: bool, grid_select: bool, zero_kernel: bool) -> Self {
        match (scores, grid_select, zero_kernel) {
            (true, ..) => Self::Scorer,
            (false, true, true) => Self::ZeroKernel,
            (false, true, false) => Self::Memset,
            (false, false, _) => Self::Caller,
        }
    }

    /// Whether the selection may read `lengths` and `active_width` before its
    /// `griddepcontrol.wait`: only after the call's own kernels, which are
    /// launched without the programmatic attribute and so start after every
    /// earlier write of the stream. A caller's kernel may let the selection
    /// start before it writes them; a memset node is left on the safe side.
    fn lengths_settled(self) -> bool {
        matches!(self, Self::Scorer | Self::ZeroKernel)
    }
}

/// A selection kernel's launch: `grid`, clusters of `cluster` CTAs along x,
/// `shared_bytes` of dynamic shared memory, as the scorer's programmatic
/// dependent.
fn select_config(grid: (u32, u32, u32), cluster: u32, shared_bytes: u32) -> LaunchConfig {
    LaunchConfig { grid, block: (SELECT_THREADS, 1, 1), shared_bytes, cluster, dependent: true }
}

/// What `Caps`, `Plan` and `bind` guarantee, asserted in debug builds only.
fn debug_check(b: &Binding) {
    let (plan, a) = (b.plan(), b.args());
    debug_assert!(SUPPORTED_TOPK.contains(&a.topk), "topk {}", a.topk);
    debug_assert!((1..=MAX_HEADS).contains(&a.heads), "heads {}", a.heads);
    debug_assert!(plan.supertile() % PREFILL_TOKENS == 0, "supertile {}", plan.supertile());
    debug_assert!(
        (1..=plan.supertile() / SUPERTILE_QUANTUM).contains(&plan.topk_slices()),
        "slices {}",
        plan.topk_slices()
    );
    debug_assert!(a.rows <= plan.rows_capacity() && a.width <= plan.width_capacity());
    debug_assert!(a.page_stride >= PAGE_BYTES && a.width as u64 * 64 <= i32::MAX as u64);
    debug_assert!(a.page_stride % 16 == 0 && a.kcache % 16 == 0 && a.q % 16 == 0);
    debug_assert!([a.q, a.weights, a.kcache, a.page_table, a.lengths, a.out_indices, a.scratch]
        .iter()
        .all(|&p| p != 0));
    debug_assert!(b.plan().caps().device == Device::Cuda(a.device));
}

/// The TMA scorers' tensor maps of one call: K pages (the cache's page
/// stride), their scales, and the rows' Q, a part's rows a box (out-of-range
/// heads and rows read as zeros).
fn hopper_maps(
    a: &b12x_core::indexer::IndexerArgs,
    heads_padded: u32,
    block_rows: u32,
) -> Result<[TensorMap; 3]> {
    let pages = a.pages.max(1);
    let k = Tiled {
        element: Element::U8,
        address: a.kcache,
        dims: &[HEAD_DIM as u64, PAGE_SIZE as u64, pages],
        strides: &[HEAD_DIM as u64, a.page_stride],
        boxes: &[HEAD_DIM, PAGE_SIZE, 1],
        swizzle128: true,
    }
    .encode("the index K cache's pages")?;
    let scales = Tiled {
        element: Element::F32,
        address: a.kcache + SCALE_OFFSET,
        dims: &[PAGE_SIZE as u64, pages],
        strides: &[a.page_stride],
        boxes: &[PAGE_SIZE, 1],
        swizzle128: false,
    }
    .encode("the index K cache's scales")?;
    let q = Tiled {
        element: Element::U8,
        address: a.q,
        dims: &[HEAD_DIM as u64, a.heads as u64, a.rows.max(1) as u64],
        strides: &[HEAD_DIM as u64, a.heads as u64 * HEAD_DIM as u64],
        boxes: &[HEAD_DIM, heads_padded, hopper_part(block_rows).0],
        swizzle128: true,
    }
    .encode("q_fp8")?;
    Ok([k, scales, q])
}

/// What a binding's launches need beyond its arguments, encoded once at bind
/// time: the TMA scorers' tensor maps describe the bound tensors' addresses,
/// so a run only copies them into the parameter block.
#[derive(Clone, Copy)]
pub struct BoundMaps {
    hopper: Option<[TensorMap; 3]>,
}

impl BoundMaps {
    /// No maps: what a binding without a launch recipe (a CPU plan) holds.
    pub const NONE: BoundMaps = BoundMaps { hopper: None };

    /// The maps `recipe`'s scorer reads for binding `b` (none for the other scorers).
    pub fn encode(b: &Binding, recipe: &LaunchRecipe) -> Result<Self> {
        let hopper = match recipe.grid {
            ScorerGrid::Tma { heads_padded, block_rows, .. } if recipe.stages.scores() => {
                Some(hopper_maps(b.args(), heads_padded, block_rows)?)
            }
            _ => None,
        };
        Ok(BoundMaps { hopper })
    }
}

/// Enqueues `b12x_indexer_zero_state` over `score.zero_words` words at
/// `score.zero` (the grid selection's row state): a CTA per 512 words, at
/// most one per SM; it lets its dependent launch at once.
///
/// # Safety
/// `score.zero` must be `score.zero_words` writable words of the device.
unsafe fn launch_zero_state(
    device: u32,
    score: &mut ScoreParams,
    recipe: &LaunchRecipe,
    stream: u64,
) -> Result<()> {
    let ctas = score.zero_words.div_ceil(ZERO_STATE_THREADS * 4).clamp(1, recipe.multiprocessors);
    let config = LaunchConfig {
        grid: (ctas, 1, 1),
        block: (ZERO_STATE_THREADS, 1, 1),
        shared_bytes: 0,
        cluster: 1,
        dependent: false,
    };
    let mut args = [std::ptr::addr_of_mut!(*score) as *mut c_void];
    // SAFETY: ScoreParams mirrors the kernel's struct; the caller vouches for `zero`.
    unsafe { launch(device, Kernel::IndexerZeroState, config, stream, &mut args) }
}

/// Enqueues the whole indexer call of `b` on `stream` (a CUstream of the
/// binding's device) as `recipe` (the binding's plan's) says: no allocation,
/// no sync. A call with zero rows enqueues nothing.
///
/// # Safety
/// `b` must come from `bind` over live tensors of its device (every address
/// valid for the accesses its documented shape implies, the scratch at least
/// `plan.nbytes()` bytes and disjoint from the operands), `recipe` must be
/// `LaunchRecipe::new(b.plan())`, `maps` `BoundMaps::encode(b, recipe)`, and
/// `stream` must belong to that device.
pub unsafe fn launch_indexer(
    b: &Binding,
    recipe: &LaunchRecipe,
    maps: &BoundMaps,
    stream: u64,
) -> Result<()> {
    debug_check(b);
    let (plan, a) = (b.plan(), b.args());
    if a.rows == 0 {
        return Ok(());
    }
    let s = plan.supertile();
    let chunks = num_chunks(a.width, s).max(1);
    let (pages_per_cta, score_config) = recipe.scorer_launch(a.rows, s);
    let pages = kernel_pages(a.pages);
    // The grid selection's row state is cleared by the scorer before it or,
    // when no scorer runs, by the clearing kernel (or a memset).
    let grid_select = if recipe.grid_select && recipe.stages.selects() {
        grid_select_shape(a.rows, s, recipe.multiprocessors)
    } else {
        None
    };
    let state = b.region_address(RegionId::RowState);
    let zero_words = if grid_select.is_some() { a.rows * SELECT_STATE_WORDS as u32 } else { 0 };
    let partial = |id| if recipe.slices > 1 { b.region_address(id) } else { 0 };
    let mut tp = TopkParams {
        logits: b.region_address(RegionId::Logits),
        lengths: a.lengths,
        active_width: a.active_width,
        page_table: a.page_table,
        carry_values: b.region_address(RegionId::CarryValues),
        carry_indices: b.region_address(RegionId::CarryIndices),
        part_values: partial(RegionId::PartialValues),
        part_indices: partial(RegionId::PartialIndices),
        out_indices: a.out_indices,
        out_scores: a.out_scores,
        logits_row_stride: s as u64,
        pt_row_stride: a.page_table_row_stride,
        carry_half_stride: plan.rows_capacity() as u64 * a.topk as u64,
        rows: a.rows,
        width: a.width,
        topk: a.topk,
        chunk: 0,
        num_chunks: chunks,
        chunk_len: s,
        slices: recipe.slices,
        slice_len: recipe.slice_len,
        physical: recipe.physical as u32,
        pages,
        stage_cap: 0,
        hit_cap: 0,
    };
    let score = ScoreParams {
        q: a.q,
        weights: a.weights,
        kcache: a.kcache,
        page_table: a.page_table,
        lengths: a.lengths,
        active_width: a.active_width,
        logits: tp.logits,
        status: recipe.status,
        page_stride: a.page_stride,
        pt_row_stride: a.page_table_row_stride,
        logits_row_stride: s as u64,
        rows: a.rows,
        heads: a.heads,
        width: a.width,
        chunk_start: 0,
        chunk_len: s,
        pages_per_cta,
        pages,
        zero_words,
        zero: state,
    };
    let mut hopper = maps.hopper.map(|[k_map, scale_map, q_map]| HopperParams {
        k_map,
        scale_map,
        q_map,
        s: score,
    });
    let mut score = score;
    let fold = if a.rows <= recipe.multiprocessors { recipe.fold_few } else { recipe.fold_many };
    // The two-stage kernels run the general paths only (no stage): the staged
    // forms measured slower on one H200 (bench-results/h200/topk-notes.md).
    let select: &[(Kernel, (u32, u32, u32), TopkStage)] = if recipe.slices == 1 {
        &[(fold.0, (a.rows, 1, 1), fold.1)]
    } else {
        &[
            (Kernel::IndexerTopkSlice, (a.rows, recipe.slices, 1), TopkStage::GENERAL),
            (Kernel::IndexerTopkMerge, (a.rows, 1, 1), TopkStage::GENERAL),
        ]
    };
    if recipe.cluster_select || grid_select.is_some() {
        debug_assert!(chunks == 1);
    }
    for c in 0..chunks {
        if recipe.stages.scores() {
            score.chunk_start = c * s;
            let mut args = match hopper.as_mut() {
                Some(h) => {
                    h.s.chunk_start = c * s;
                    [std::ptr::addr_of_mut!(*h) as *mut c_void]
                }
                None => [std::ptr::addr_of_mut!(score) as *mut c_void],
            };
            // SAFETY: ScoreParams / HopperParams mirror the kernels' parameter
            // structs; pointer validity is the caller's contract.
            unsafe { launch(a.device, recipe.scorer, score_config, stream, &mut args)? };
        }
        if !recipe.stages.selects() {
            continue;
        }
        if recipe.cluster_select || grid_select.is_some() {
            let primary = SelectPrimary::of(
                recipe.stages.scores(),
                grid_select.is_some(),
                recipe.zero_kernel,
            );
            debug_assert!(!score_config.dependent);
            let mut sp = SelectParams {
                logits: tp.logits,
                lengths: a.lengths,
                active_width: a.active_width,
                page_table: a.page_table,
                out_indices: a.out_indices,
                out_scores: a.out_scores,
                logits_row_stride: s as u64,
                pt_row_stride: a.page_table_row_stride,
                rows: a.rows,
                width: a.width,
                topk: a.topk,
                physical: recipe.physical as u32,
                pages,
                lengths_settled: primary.lengths_settled() as u32,
                state,
                cand: b.region_address(RegionId::SelectCandidates),
            };
            // Either starts while the scorer drains (the scorer signals at its
            // start; the selection waits for its logits in griddepcontrol.wait).
            let (kernel, cfg) = match grid_select {
                Some((parts, per)) => {
                    match primary {
                        // The clearing kernel, the selection its programmatic
                        // dependent (it reads the state past its pdl_wait).
                        // SAFETY: `score` holds the binding's row state, `zero_words` words.
                        SelectPrimary::ZeroKernel => unsafe {
                            launch_zero_state(a.device, &mut score, recipe, stream)?
                        },
                        // SAFETY: the row state is the binding's scratch, `zero_words` words.
                        SelectPrimary::Memset => unsafe {
                            memset_u32(a.device, state, zero_words, stream)?
                        },
                        // The scorer cleared it (`Caller` is the cluster
                        // selection's, never a grid selection's).
                        SelectPrimary::Scorer | SelectPrimary::Caller => {}
                    }
                    let cfg = select_config((parts, a.rows, 1), 1, GRID_SELECT_SHARED_BYTES);
                    (grid_select_kernel(per), cfg)
                }
                None => {
                    let (cluster, per) = select_shape(a.rows, s, recipe.multiprocessors);
                    let grid = (cluster, a.rows, 1);
                    (select_kernel(per), select_config(grid, cluster, CLUSTER_SELECT_SHARED_BYTES))
                }
            };
            let mut sargs = [std::ptr::addr_of_mut!(sp) as *mut c_void];
            // SAFETY: SelectParams mirrors the kernels' struct; the one chunk's
            // logits, the row state and the outputs are the binding's.
            unsafe { launch(a.device, kernel, cfg, stream, &mut sargs)? };
            continue;
        }
        tp.chunk = c;
        for &(kernel, grid, stage) in select {
            tp.stage_cap = stage.stage_cap;
            tp.hit_cap = stage.hit_cap;
            let cfg = LaunchConfig {
                grid,
                block: (topk_block(kernel), 1, 1),
                shared_bytes: stage.shared_bytes,
                cluster: 1,
                dependent: false,
            };
            let mut targs = [std::ptr::addr_of_mut!(tp) as *mut c_void];
            // SAFETY: as above, TopkParams mirrors the kernels' struct.
            unsafe { launch(a.device, kernel, cfg, stream, &mut targs)? };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use b12x_core::indexer::{Precision, HEAD_TILE, SCALE_OFFSET};

    /// `#define NAME value` of the kernel sources, where the value is a
    /// literal, another define, or a product of those (in parentheses).
    fn define(sources: &[&str], name: &str) -> u64 {
        let prefix = format!("#define {name} ");
        let line = sources
            .iter()
            .flat_map(|s| s.lines())
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("{name} is not defined"));
        let text = line[prefix.len()..].split("//").next().unwrap();
        text.trim()
            .trim_matches(|c| c == '(' || c == ')')
            .split('*')
            .map(|factor| {
                let f = factor.trim().trim_end_matches('u');
                match f.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
                    None => f.parse().unwrap_or_else(|_| define(sources, f)),
                }
            })
            .product()
    }

    #[test]
    fn kernel_constants_match_the_sources() {
        let sources = [
            include_str!("../../../kernels/indexer_common.cuh"),
            include_str!("../../../kernels/indexer_decode.cu"),
            include_str!("../../../kernels/indexer_prefill.cu"),
            include_str!("../../../kernels/indexer_wgmma.cu"),
            include_str!("../../../kernels/indexer_topk.cu"),
            include_str!("../../../kernels/indexer_hopper.cu"),
            include_str!("../../../kernels/indexer_select.cu"),
        ];
        for (name, value) in [
            // b12x_core::indexer: the page format and the status record
            ("IDX_PAGE_ROWS", PAGE_SIZE as u64),
            ("IDX_HEAD_DIM", HEAD_DIM as u64),
            ("IDX_SCALE_OFFSET", SCALE_OFFSET),
            ("IDX_STATUS_WORDS", STATUS_WORDS as u64),
            ("IDX_HEAD_TILE", HEAD_TILE as u64),
            ("IDX_MAX_HEADS", MAX_HEADS as u64),
            ("IDX_TOPK_MIN", SUPPORTED_TOPK[0] as u64),
            ("IDX_TOPK_MAX", *SUPPORTED_TOPK.last().unwrap() as u64),
            ("PREFILL_TOKENS", SUPERTILE_QUANTUM as u64),
            // this launcher's tile shapes
            ("DECODE_WARPS", DECODE_WARPS as u64),
            ("DECODE_MAX_PAGES_PER_CTA", DECODE_MAX_PAGES_PER_CTA as u64),
            ("PREFILL_WARPS", PREFILL_WARPS as u64),
            ("PREFILL_TOKENS", PREFILL_TOKENS as u64),
            ("PREFILL_ROWS", PREFILL_ROWS as u64),
            ("TOPK_THREADS", TOPK_THREADS as u64),
            ("TOPK_STREAM_THREADS", TOPK_STREAM_THREADS as u64),
            ("TOPK_STREAM_CTAS", TOPK_STREAM_CTAS as u64),
            ("STREAM_SUB_BINS", TOPK_STREAM_SUB_BINS as u64),
            ("STAGED_HIT_MAX", STAGED_HIT_MAX as u64),
            ("WG_THREADS", WGMMA_THREADS as u64),
            ("WG_DECODE_STAGES", WGMMA_DECODE_STAGES as u64),
            ("WG_PREFILL_STAGES", WGMMA_PREFILL_STAGES as u64),
            ("WG_PREFILL_ROWS", WGMMA_PREFILL_ROWS as u64),
            ("WG_PREFILL_MIN_CTAS", WGMMA_PREFILL_CTAS_PER_SM as u64),
            ("HP_DECODE_THREADS", HOPPER_DECODE_THREADS as u64),
            ("HP_PREFILL_THREADS", HOPPER_PREFILL_THREADS as u64),
            ("HP_DECODE_STAGES", HOPPER_DECODE_STAGES as u64),
            ("HP_FAST_DECODE_THREADS", HOPPER_FAST_DECODE_THREADS as u64),
            ("HP_FAST_DECODE_STAGES", HOPPER_FAST_DECODE_STAGES as u64),
            ("HP_FAST_DECODE_CTAS", HOPPER_FAST_DECODE_CTAS_PER_SM as u64),
            ("HP_PREFILL_STAGES", HOPPER_PREFILL_STAGES as u64),
            ("HP_PREFILL_ROWS", TMA_PREFILL_BLOCK_ROWS as u64),
            ("HP_PREFILL_PART_ROWS", HOPPER_PREFILL_PART_ROWS as u64),
            ("HP_LIN_LEVELS", HOPPER_LIN_LEVELS as u64),
            ("HP_MAX_BLOCKS", TMA_MAX_ROW_BLOCKS as u64),
            ("SEL_THREADS", SELECT_THREADS as u64),
            ("SG_STATE_WORDS", SELECT_STATE_WORDS),
            ("SG_CAND_CAP", SELECT_CANDIDATES),
            ("SC_CAND_CAP", CLUSTER_SELECT_CANDIDATES as u64),
            ("SG_MAX_PARTS", GRID_SELECT_MAX_PARTS as u64),
            ("SEL_BINS", 2048), // a selection level's bins: a key's top 11 bits
            ("IDX_ZERO_STATE_THREADS", ZERO_STATE_THREADS as u64),
        ] {
            assert_eq!(define(&sources, name), value, "{name}");
        }
        assert_eq!(PAGE_BYTES, (PAGE_SIZE * HEAD_DIM + PAGE_SIZE * 4) as u64);
        // the supported widths: every power of two from the kernels' min to max
        let widths: Vec<u32> = (9..=11).map(|k| 1 << k).collect();
        assert_eq!(SUPPORTED_TOPK.as_slice(), widths.as_slice());
    }

    #[test]
    fn param_structs_match_the_kernels_layout() {
        // 12 u64 + 8 u32 and 13 u64 + 12 u32 (kernels/indexer_common.cuh, indexer_topk.cu).
        assert_eq!(std::mem::size_of::<ScoreParams>(), 12 * 8 + 8 * 4);
        assert_eq!(std::mem::size_of::<TopkParams>(), 13 * 8 + 12 * 4);
        // three 64-byte aligned 128-byte tensor maps, then the score block, padded to 64
        assert_eq!(std::mem::offset_of!(HopperParams, s), 3 * 128);
        assert_eq!(std::mem::size_of::<HopperParams>(), 512);
        assert_eq!(std::mem::align_of::<HopperParams>(), 64);
        assert_eq!(std::mem::size_of::<SelectParams>(), 10 * 8 + 6 * 4);
    }

    #[test]
    fn cluster_select_shapes() {
        // 64 rows x 32768: two CTAs per row fill one wave of 132 SMs
        assert_eq!(select_shape(64, 32768, 132), (2, 16));
        // one row x 131072: the largest cluster, 16 logits per thread
        assert_eq!(select_shape(1, 131072, 132), (8, 16));
        assert_eq!(select_shape(16, 65536, 132), (8, 8));
        assert_eq!(select_shape(1, 4096, 132), (8, 4));
        // many rows: the smallest cluster that covers the row
        assert_eq!(select_shape(4096, 32768, 132), (2, 16));
        for (rows, st) in [(1, 512), (3, 1536), (64, 131072), (1000, 8192)] {
            let (cluster, per) = select_shape(rows, st, 132);
            assert!(cluster.is_power_of_two() && cluster <= SELECT_MAX_CLUSTER);
            assert!([4, 8, 16].contains(&per) && cluster * SELECT_THREADS * per >= st);
        }
    }

    #[test]
    fn grid_selection_kernels_by_width() {
        use Kernel::*;
        let kernels = [2, 4, 8, 16].map(grid_select_kernel);
        let want =
            [IndexerGridSelectP2, IndexerGridSelectP4, IndexerGridSelectP8, IndexerGridSelectP16];
        assert_eq!(kernels, want);
        // the entry points the PTX exports (checked in ptx.rs): gselect_p{2,4,8,16}
        assert_eq!(IndexerGridSelectP8.symbol(), "b12x_indexer_gselect_p8");
    }

    #[test]
    fn selection_reads_lengths_early_only_after_its_own_kernels() {
        use SelectPrimary::*;
        for grid in [false, true] {
            for zero in [false, true] {
                assert_eq!(SelectPrimary::of(true, grid, zero), Scorer);
            }
        }
        assert_eq!(SelectPrimary::of(false, true, true), ZeroKernel);
        assert_eq!(SelectPrimary::of(false, true, false), Memset);
        assert_eq!(SelectPrimary::of(false, false, true), Caller);
        assert_eq!(SelectPrimary::of(false, false, false), Caller);
        let settled = [Scorer, ZeroKernel, Memset, Caller].map(SelectPrimary::lengths_settled);
        assert_eq!(settled, [true, true, false, false]);
    }

    #[test]
    fn grid_select_shapes() {
        // one row x 131072: 64 CTAs of 2048 logits; two rows: 64 each;
        // three: 32 each at 4 a thread
        assert_eq!(grid_select_shape(1, 131072, 132), Some((64, 2)));
        assert_eq!(grid_select_shape(2, 131072, 132), Some((64, 2)));
        assert_eq!(grid_select_shape(3, 131072, 132), Some((32, 4)));
        // 16 rows x 65536: one wave at 8 logits per thread
        assert_eq!(grid_select_shape(16, 65536, 132), Some((8, 8)));
        // 2 CTAs a row (64 x 32768), short rows, a row past 128 CTAs: none
        assert_eq!(grid_select_shape(64, 32768, 132), None);
        assert_eq!(grid_select_shape(1, 8192, 132), None);
        assert_eq!(grid_select_shape(1, 128 * 16384 + 512, 132), None);
        for (rows, st) in [(1, 16384), (3, 65536), (8, 262144), (32, 65536)] {
            let (parts, per) = grid_select_shape(rows, st, 132).unwrap();
            assert!((4..=GRID_SELECT_MAX_PARTS).contains(&parts) && rows * parts <= 132);
            assert!(parts * SELECT_THREADS * per >= st);
        }
    }

    #[test]
    fn hopper_shapes_fit_the_h200() {
        const H200: u32 = 232448;
        // fast decode: 8 x 8 KiB ring + 2 Q stages of 8 KiB + scales, ids,
        // barriers, the scan; two CTAs (each with the runtime's 1 KiB) share an SM
        assert_eq!(
            hopper_shared_bytes(64, 1),
            8 * 8192 + 2 * 8192 + 8 * 260 + 20 * 8 + 4097 * 4 + 128 + 1024
        );
        assert!(HOPPER_FAST_DECODE_CTAS_PER_SM * (hopper_shared_bytes(64, 1) + 1024) <= 233472);
        // prefill: 4 parts of 2 rows x 64 heads of Q and 2 x 4 linear-part
        // rows per stage, the levels' scales
        assert_eq!(
            hopper_shared_bytes(64, 8),
            8 * 8192 + 2 * 4 * 136 * 128 + 8 * 260 + 2 * 8 * 4 * 4 + 20 * 8 + 4097 * 4 + 128 + 1024
        );
        // a producer warpgroup and four (exact decode) or two (fast decode, two
        // CTAs an SM; prefill) consumers
        assert_eq!(hopper_shape(1, false), (640, 1));
        assert_eq!(hopper_shape(1, true), (384, 2));
        assert_eq!(hopper_shape(TMA_PREFILL_BLOCK_ROWS, true), (384, 1));
        for heads in [16, 32, 48, 64] {
            for rows in [1, TMA_PREFILL_BLOCK_ROWS] {
                assert!(hopper_shared_bytes(heads, rows) <= H200, "{heads} x {rows}");
            }
        }
    }

    #[test]
    fn topk_stages_fit_the_device_and_fall_back_to_the_general_paths() {
        const H200: u32 = 232448; // 227 KiB opt-in
        const H200_SM: u32 = 233472; // 228 KiB an SM
        const SM120: u32 = 101376; // 99 KiB opt-in
        const SM120_SM: u32 = 102400; // 100 KiB an SM
                                      // decode rows of 32768 + a 512 carry: raw stage, 2048 hits
        let (k, st) = topk_fold_kernel(64, 512, 512 + 32768, 132, H200, H200_SM);
        assert_eq!(k, Kernel::IndexerTopkFold);
        assert_eq!(st, TopkStage { stage_cap: 33280, hit_cap: 2048, shared_bytes: 174256 });
        // more rows than SMs: the stream kernel, its buffer at 5 topk + 1024,
        // with level 1's counts
        let (k, st) = topk_fold_kernel(4096, 512, 512 + 32768, 132, H200, H200_SM);
        assert_eq!(k, Kernel::IndexerTopkStream);
        assert_eq!(
            st,
            TopkStage {
                stage_cap: TOPK_STREAM_SUB_BINS,
                hit_cap: 3584,
                shared_bytes: TOPK_STAGED_SMEM + TOPK_STREAM_SUB_SMEM + 8 * 3584
            }
        );
        assert_eq!(topk_block(k), TOPK_STREAM_THREADS);
        let two_ctas = |st: TopkStage, per_sm| 2 * (st.shared_bytes + 1024) <= per_sm;
        assert!(two_ctas(st, H200_SM));
        // top-1024 keeps them too; top-2048's whole buffer and them would
        // leave one CTA an SM: the buffer alone
        let st = topk_stream_stage(1024, H200, H200_SM).unwrap();
        assert_eq!((st.stage_cap, st.hit_cap), (TOPK_STREAM_SUB_BINS, 6144));
        assert!(two_ctas(st, H200_SM));
        let st = topk_stream_stage(2048, H200, H200_SM).unwrap();
        assert_eq!(st, TopkStage { stage_cap: 0, hit_cap: 11264, shared_bytes: 106672 });
        assert!(two_ctas(st, H200_SM));
        // sm_120: two CTAs of the buffer alone at top-512
        let st = topk_stream_stage(512, SM120, SM120_SM).unwrap();
        assert_eq!((st.stage_cap, st.hit_cap), (0, 3584));
        assert!(two_ctas(st, SM120_SM));
        // shrunk to fit 99 KiB; the radix path's own shared memory at least
        let st = topk_stream_stage(2048, SM120, SM120_SM).unwrap();
        assert_eq!(st.hit_cap, ((SM120 - TOPK_STAGED_SMEM) / 8) & !3);
        assert!(st.stage_cap == 0 && st.shared_bytes <= SM120);
        let st = topk_stream_stage(512, 41240, H200_SM).unwrap();
        assert_eq!(st, TopkStage { stage_cap: 0, hit_cap: 3084, shared_bytes: 41240 });
        assert_eq!(topk_stream_stage(512, 41000, H200_SM), None);
        assert_eq!(topk_stream_stage(2048, 30000, H200_SM), None);
        // the prefix stage, two CTAs per SM, where the raw one does not fit
        let st = topk_stage(false, 512, 512 + 32768, H200);
        assert_eq!(st.shared_bytes, TOPK_STAGED_SMEM + 12 * 2048 + 2 * 33280);
        assert!(2 * (st.shared_bytes + 1024) <= 233472);
        // 99 KiB: the raw stage does not fit; the prefix one does with a shorter list
        let (k, st) = topk_fold_kernel(64, 512, 512 + 32768, 188, SM120, SM120_SM);
        assert_eq!(k, Kernel::IndexerTopkFoldPrefix);
        assert_eq!(st.hit_cap, 1520);
        assert!(st.shared_bytes <= SM120);
        // nothing fits: the general paths only, in their own shared memory
        let none = topk_stage(true, 2048, 131072 + 2048, SM120);
        assert_eq!(none, TopkStage::GENERAL);
        assert_eq!(TopkStage::GENERAL.shared_bytes, 41240);
        // hit lists are multiples of 4 and never above the kernels' maximum
        for topk in SUPPORTED_TOPK {
            for cand in [1024, 8192, 33280, 67584] {
                for raw in [true, false] {
                    let st = topk_stage(raw, topk, cand, H200);
                    assert_eq!(st.hit_cap % 4, 0);
                    assert!(st.hit_cap <= STAGED_HIT_MAX && st.shared_bytes <= H200);
                    let want = if st.stage_cap == 0 {
                        TOPK_GENERAL_SMEM
                    } else {
                        topk_shared_bytes(raw, st.hit_cap, cand)
                    };
                    assert_eq!(st.shared_bytes, want);
                }
            }
        }
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
        assert_eq!(kernel_pages(10), 10);
        assert_eq!(kernel_pages(u64::MAX), 1 << 31);
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
        assert_eq!(wgmma_shared_bytes(64, 1, false), 32768 + 16384 + 1024 + 320 + 16 + 1024);
        assert_eq!(wgmma_shared_bytes(64, 4, false), 32768 + 65536 + 1024 + 1088 + 16 + 1024);
        // the fast flavor keeps Q as FP8: half the Q bytes
        assert_eq!(wgmma_shared_bytes(64, 1, true), 32768 + 8192 + 1024 + 320 + 16 + 1024);
        assert_eq!(wgmma_shared_bytes(64, 4, true), 32768 + 32768 + 1024 + 1088 + 16 + 1024);
        // 1024 row blocks fill the SMs: one split; 16 row blocks: the chunk is split.
        assert_eq!(wgmma_prefill_pages_per_cta(4096, 32768, 132), 512);
        assert_eq!(wgmma_prefill_pages_per_cta(64, 32768, 132), 16);
        assert_eq!(wgmma_prefill_pages_per_cta(1, 512, 132), 1);
    }

    #[test]
    fn exact_tma_shapes() {
        // prefill, 64 heads: 8 x 8 KiB ring, two warpgroups' f16 Q (4 rows x 64
        // heads x 256 bytes each), 8 stages' scales and ids, both warpgroups' weights
        // (4 lanes x 34 pairs x 8 bytes), 16 barriers, the scan, the alignment.
        let scan = (TMA_MAX_ROW_BLOCKS + 1) * 4 + 128;
        let expect = 65536 + 131072 + 8 * 260 + 2 * 1088 + 128 + scan + 1024;
        assert_eq!(hopper_exact_shared_bytes(64, TMA_PREFILL_BLOCK_ROWS), expect);
        // under the H200's opt-in limit, with room for the kernel's own alignment
        assert!(expect <= 232_448, "{expect}");
        // decode: 16 x 8 KiB ring, one row's f16 Q (64 heads x 256 bytes), one
        // set of weights (4 lanes x 10 pairs x 8 bytes), 32 barriers, the scan
        let expect = 131072 + 16384 + 16 * 260 + 320 + 256 + scan + 1024;
        assert_eq!(hopper_exact_shared_bytes(64, 1), expect);
    }

    #[test]
    fn scorer_table_matches_route_flavor_and_heads() {
        for (route, name) in [(Route::PagedDecode, "decode"), (Route::SharedPrefill, "prefill")] {
            for flavor in MmaFlavor::ALL {
                let tag = flavor.name();
                for (heads, tile) in [(1, 16), (16, 16), (17, 32), (48, 48), (64, 64)] {
                    let symbol = scorer(route, flavor, heads).symbol();
                    let flavor_first = matches!(
                        flavor,
                        MmaFlavor::Wgmma
                            | MmaFlavor::WgmmaFp8
                            | MmaFlavor::TmaFp8
                            | MmaFlavor::TmaF16
                    );
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

    /// Core's default flavor for an arch always has its kernels in a module
    /// that loads on that arch (the module table is the one "where" table).
    #[test]
    fn default_flavors_run_where_they_are_picked() {
        for cc in [(8, 9), (9, 0), (10, 0), (12, 0)] {
            for precision in [Precision::Exact, Precision::Fast] {
                let flavor = MmaFlavor::for_device(cc, precision);
                for route in [Route::PagedDecode, Route::SharedPrefill] {
                    for f in [flavor, flavor.fallback()] {
                        let kernel = scorer(route, f, 64);
                        assert!(kernel.module().target.runs_on(cc), "{cc:?}: {kernel:?}");
                    }
                }
            }
        }
    }
}
