//! `Plan`: everything a call needs that depends only on the caps and static
//! device properties. Immutable and `Arc`-shared; holds no tensors and no
//! addresses, so one plan serves any number of concurrent bindings.

use std::fmt;

use super::caps::{Caps, Mode, Precision};
use super::layout::{LayoutInput, ScratchLayout};
use super::{
    DECODE_LOGITS_BUDGET, DEFAULT_SUPERTILE, GRID_SELECT_MIN_PARTS, HEAD_TILE, PAGE_SIZE,
    SUPERTILE_QUANTUM, TMA_MAX_ROW_BLOCKS, TMA_PREFILL_BLOCK_ROWS, TOPK_SLICE_MIN,
};
use crate::error::{Error, Result};

/// Which kernel sequence a plan runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// Decode: one page-table row per query row; the scorer reads pages in
    /// place, chunk by chunk, folding a top-k carry.
    PagedDecode,
    /// Prefill: every query row shares one page-table row (stride 0).
    /// Named `packed_contiguous`, the name vLLM's b12x adapters assert.
    SharedPrefill,
}

impl Route {
    pub const fn name(self) -> &'static str {
        match self {
            Route::PagedDecode => "paged_decode",
            Route::SharedPrefill => "packed_contiguous",
        }
    }
}

/// Which MMA the scorers use (kernels/indexer_{decode,prefill,wgmma}.cu).
/// The exact flavors give the same logits: FP8 products are exact in f32,
/// every e4m3 value is an f16 value, and each accumulates in fp32.
/// [`MmaFlavor::WgmmaFp8`] is the fast one ([`Precision::Fast`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MmaFlavor {
    /// `mma.sync m16n8k32 .e4m3` on the raw bytes (native on sm_89 and sm_120).
    E4m3,
    /// FP8 widened to f16 once, `mma.sync m16n8k16 .f16` (sm_90 has no native
    /// e4m3 `mma.sync`: it would unpack both operands per MMA).
    F16,
    /// Hopper's warpgroup MMA on FP8 widened to f16 (`wgmma m64nNk16 .f16`,
    /// sm_90a only): exact products, fp32 accumulation.
    Wgmma,
    /// Hopper's FP8 warpgroup MMA on the raw bytes (`wgmma m64nNk32 .e4m3`,
    /// sm_90a only): half the MMAs, reduced-precision accumulation.
    WgmmaFp8,
    /// The same FP8 wgmma with both operands in shared memory, fed by TMA in
    /// persistent CTAs (kernels/indexer_hopper.cu, sm_90a only). Serves plans
    /// of at most [`TMA_MAX_ROW_BLOCKS`] row blocks.
    TmaFp8,
    /// The exact flavor of that pipeline: the TMA-fed K pages widened to f16
    /// in registers (A), the rows' Q staged as f16 (B), `wgmma m64nNk16 .f16`
    /// with fp32 accumulation, as [`MmaFlavor::Wgmma`]. Same row-block bound
    /// as [`MmaFlavor::TmaFp8`].
    TmaF16,
}

impl MmaFlavor {
    pub const ALL: [MmaFlavor; 6] = [
        MmaFlavor::E4m3,
        MmaFlavor::F16,
        MmaFlavor::Wgmma,
        MmaFlavor::WgmmaFp8,
        MmaFlavor::TmaFp8,
        MmaFlavor::TmaF16,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            MmaFlavor::E4m3 => "e4m3",
            MmaFlavor::F16 => "f16",
            MmaFlavor::Wgmma => "wgmma",
            MmaFlavor::WgmmaFp8 => "wgmma_fp8",
            MmaFlavor::TmaFp8 => "tma_fp8",
            MmaFlavor::TmaF16 => "tma_f16",
        }
    }

    /// Whether this flavor keeps the exact contract ([`Precision::Exact`]).
    pub const fn is_exact(self) -> bool {
        !matches!(self, MmaFlavor::WgmmaFp8 | MmaFlavor::TmaFp8)
    }

    pub fn parse(s: &str) -> Result<MmaFlavor> {
        MmaFlavor::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| Error::InvalidValue {
            op: "plan",
            operand: "mma_flavor".into(),
            expected: "one of {e4m3, f16, wgmma, wgmma_fp8, tma_fp8, tma_f16}".into(),
            got: format!("{s:?}"),
        })
    }

    /// The flavor a plan picks for a device of compute capability `cc`: the
    /// fastest measured there that meets `precision` (rust/cuda's module
    /// table says where each runs). Only Hopper has a faster, inexact path.
    pub fn for_device(cc: (u32, u32), precision: Precision) -> MmaFlavor {
        match (cc, precision) {
            ((8, 9) | (12, _), _) => MmaFlavor::E4m3,
            ((9, 0), Precision::Exact) => MmaFlavor::TmaF16,
            ((9, 0), Precision::Fast) => MmaFlavor::TmaFp8,
            _ => MmaFlavor::F16,
        }
    }

    /// Whether this flavor's scorers serve a plan of `rows` query rows in
    /// `mode` (the TMA scorers' work scan holds a bounded number of row blocks).
    pub fn serves(self, mode: Mode, rows: u32) -> bool {
        let block_rows = match mode {
            Mode::Decode => 1,
            Mode::Prefill => TMA_PREFILL_BLOCK_ROWS,
        };
        !matches!(self, MmaFlavor::TmaFp8 | MmaFlavor::TmaF16)
            || rows.div_ceil(block_rows) <= TMA_MAX_ROW_BLOCKS
    }

    /// What runs where this flavor does not serve a plan: the wgmma scorer
    /// of the same precision.
    pub const fn fallback(self) -> MmaFlavor {
        match self {
            MmaFlavor::TmaFp8 => MmaFlavor::WgmmaFp8,
            MmaFlavor::TmaF16 => MmaFlavor::Wgmma,
            other => other,
        }
    }
}

/// What a plan depends on beyond its caps: static facts of its device, read
/// by the caller (this crate does not talk to the driver).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceFacts {
    pub multiprocessors: u32,
    /// (0, 0) on the CPU.
    pub compute_capability: (u32, u32),
}

impl DeviceFacts {
    pub const CPU: DeviceFacts = DeviceFacts { multiprocessors: 1, compute_capability: (0, 0) };
}

/// Choices a plan normally makes itself, forced (tests and benchmarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlanOptions {
    /// Run this MMA flavor instead of the device's (it must run there: the
    /// caller checks that against the loaded kernels).
    pub mma_flavor: Option<MmaFlavor>,
    /// Which stages a run launches (benchmarks time each stage alone).
    pub stages: Stages,
}

/// The stages a run launches: both (every real call), or one alone for the
/// benchmark's stage arms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Stages {
    #[default]
    All,
    /// The scorer alone: logits into the scratch, no selection (outputs unwritten).
    ScoreOnly,
    /// The top-k alone, on the logits already in the scratch (meaningful for
    /// one-chunk plans, after a full run over the same scratch).
    TopkOnly,
}

impl Stages {
    pub const fn name(self) -> &'static str {
        match self {
            Stages::All => "all",
            Stages::ScoreOnly => "score_only",
            Stages::TopkOnly => "topk_only",
        }
    }
    /// Whether runs launch the scorer.
    pub const fn scores(self) -> bool {
        !matches!(self, Stages::TopkOnly)
    }
    /// Whether runs launch the selection.
    pub const fn selects(self) -> bool {
        !matches!(self, Stages::ScoreOnly)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    caps: Caps,
    route: Route,
    /// None on the CPU, where the reference runs.
    mma_flavor: Option<MmaFlavor>,
    stages: Stages,
    heads_padded: u32,
    supertile: u32,
    max_chunks: u32,
    multiprocessors: u32,
    topk_slices: u32,
    grid_select_state: bool,
    layout: ScratchLayout,
}

impl Plan {
    /// Builds the plan for `caps` rounded up to its buckets, on a device
    /// with the given facts ([`DeviceFacts::CPU`] for a CPU plan).
    pub fn new(caps: &Caps, device: &DeviceFacts) -> Result<Plan> {
        Plan::with_options(caps, device, &PlanOptions::default())
    }

    /// [`Plan::new`] with forced choices (tests and benchmarks).
    pub fn with_options(caps: &Caps, device: &DeviceFacts, options: &PlanOptions) -> Result<Plan> {
        let multiprocessors = device.multiprocessors;
        if multiprocessors == 0 {
            return Err(Error::InvalidValue {
                op: "plan",
                operand: "multiprocessors".into(),
                expected: "at least 1".into(),
                got: "0".into(),
            });
        }
        let caps = caps.bucketed();
        let route = match caps.mode {
            Mode::Decode => Route::PagedDecode,
            Mode::Prefill => Route::SharedPrefill,
        };
        let width_tokens = caps.max_page_table_width as u64 * PAGE_SIZE as u64;
        let quantum = SUPERTILE_QUANTUM as u64;
        let rows = caps.max_q_rows as u64;
        let supertile = if caps.supertile_tokens != 0 {
            caps.supertile_tokens as u64
        } else {
            // Small caches get small chunks. Decode plans with few rows take
            // the whole width in one chunk while the logits fit the budget
            // (a chunk chain serializes score -> top-k launches per chunk);
            // every bound is a multiple of 512.
            let cap = match caps.mode {
                Mode::Decode => {
                    let budget = (DECODE_LOGITS_BUDGET / rows) / quantum * quantum;
                    budget.max(DEFAULT_SUPERTILE as u64)
                }
                Mode::Prefill => DEFAULT_SUPERTILE as u64,
            };
            width_tokens.next_multiple_of(quantum).min(cap)
        };
        let max_chunks = width_tokens.div_ceil(supertile);
        // Two-stage top-k when rows alone cannot fill half the SMs: each row's
        // chunk is cut into slices of >= TOPK_SLICE_MIN tokens reduced in
        // parallel, then merged (a single CTA per row would take ~8 us
        // more per 32K logits on an H200).
        let topk_slices = match caps.mode {
            Mode::Decode => {
                (multiprocessors as u64 / (2 * rows)).min(supertile / TOPK_SLICE_MIN as u64).max(1)
            }
            Mode::Prefill => 1,
        };
        let mma_flavor = match (caps.device.is_cuda(), options.mma_flavor) {
            (true, Some(forced)) if !forced.serves(caps.mode, caps.max_q_rows) => {
                return Err(Error::InvalidValue {
                    op: "plan",
                    operand: "mma_flavor".into(),
                    expected: format!(
                        "a flavor that serves {} {} rows (tma_fp8, tma_f16: at most {} row \
                         blocks)",
                        caps.max_q_rows,
                        caps.mode.name(),
                        TMA_MAX_ROW_BLOCKS
                    )
                    .into(),
                    got: format!("{:?}", forced.name()),
                })
            }
            (true, Some(forced)) => Some(forced),
            (true, None) => {
                let best = MmaFlavor::for_device(device.compute_capability, caps.precision);
                // The TMA scorers past their row-block bound: the wgmma ones.
                Some(if best.serves(caps.mode, caps.max_q_rows) { best } else { best.fallback() })
            }
            (false, None) => None,
            (false, Some(f)) => {
                return Err(Error::InvalidValue {
                    op: "plan",
                    operand: "mma_flavor".into(),
                    expected: "None on a CPU plan (the reference runs there)".into(),
                    got: format!("{:?}", f.name()),
                })
            }
        };
        let heads_padded = caps.num_q_heads.next_multiple_of(HEAD_TILE);
        // The grid selection (one-chunk decode, few rows) keeps its cross-CTA
        // state in the row state and its candidates in `select_candidates`;
        // rows x its fewest CTAs must fit one wave.
        let grid_select_state = caps.device.is_cuda()
            && route == Route::PagedDecode
            && max_chunks == 1
            && rows * GRID_SELECT_MIN_PARTS as u64 <= multiprocessors as u64;
        let layout = ScratchLayout::new(&LayoutInput {
            rows: caps.max_q_rows as u64,
            topk: caps.topk as u64,
            supertile,
            width: caps.max_page_table_width as u64,
            heads_padded: heads_padded as u64,
            max_chunks,
            multiprocessors: multiprocessors as u64,
            topk_slices,
            grid_select_state,
        })?;
        if options.stages != Stages::All && !caps.device.is_cuda() {
            return Err(Error::InvalidValue {
                op: "plan",
                operand: "stages".into(),
                expected: "all on a CPU plan (the reference runs the whole op)".into(),
                got: options.stages.name().into(),
            });
        }
        Ok(Plan {
            caps,
            route,
            mma_flavor,
            stages: options.stages,
            heads_padded,
            // all fit: supertile <= width_tokens < 2^30 (or an explicit <= 65536),
            // max_chunks <= width_tokens / 512 < 2^21, topk_slices <= SMs
            supertile: supertile as u32,
            max_chunks: max_chunks as u32,
            multiprocessors,
            topk_slices: topk_slices as u32,
            grid_select_state,
            layout,
        })
    }

    /// The bucketed caps: `max_q_rows` and `max_page_table_width` are this
    /// plan's capacities.
    #[inline]
    pub fn caps(&self) -> &Caps {
        &self.caps
    }
    #[inline]
    pub fn route(&self) -> Route {
        self.route
    }
    /// The scorers' MMA flavor; None on the CPU (the reference runs there).
    #[inline]
    pub fn mma_flavor(&self) -> Option<MmaFlavor> {
        self.mma_flavor
    }
    /// The stages runs launch ([`PlanOptions::stages`]).
    #[inline]
    pub fn stages(&self) -> Stages {
        self.stages
    }
    /// `num_q_heads` rounded up to a multiple of 16 (the MMA head tile).
    #[inline]
    pub fn heads_padded(&self) -> u32 {
        self.heads_padded
    }
    /// K rows scored per chunk: a multiple of 512.
    #[inline]
    pub fn supertile(&self) -> u32 {
        self.supertile
    }
    /// ceil(width capacity · 64 / supertile): chunks of a full-width call.
    #[inline]
    pub fn max_chunks(&self) -> u32 {
        self.max_chunks
    }
    #[inline]
    pub fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }
    /// Slices of the two-stage top-k (1: one CTA per row reads the chunk).
    #[inline]
    pub fn topk_slices(&self) -> u32 {
        self.topk_slices
    }
    /// Whether the scratch holds the grid selection's row state
    /// (`SELECT_STATE_WORDS` words a row) and candidates
    /// (`SELECT_CANDIDATES` a row): a CUDA one-chunk decode plan whose rows
    /// take `GRID_SELECT_MIN_PARTS` CTAs each in one wave.
    #[inline]
    pub fn grid_select_state(&self) -> bool {
        self.grid_select_state
    }
    #[inline]
    pub fn layout(&self) -> &ScratchLayout {
        &self.layout
    }
    #[inline]
    pub fn rows_capacity(&self) -> u32 {
        self.caps.max_q_rows
    }
    #[inline]
    pub fn width_capacity(&self) -> u32 {
        self.caps.max_page_table_width
    }
    #[inline]
    pub fn nbytes(&self) -> u64 {
        self.layout.nbytes()
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "route={}, device={}, num_q_heads={}, max_q_rows={}, max_page_table_width={}, \
             topk={}, output_index_space={}, supertile_tokens={}, max_chunks={}, nbytes={}, \
             precision={}, mma_flavor={}",
            self.route.name(),
            self.caps.device,
            self.caps.num_q_heads,
            self.caps.max_q_rows,
            self.caps.max_page_table_width,
            self.caps.topk,
            self.caps.index_space.name(),
            self.supertile,
            self.max_chunks,
            self.nbytes(),
            self.caps.precision.name(),
            self.mma_flavor.map_or("reference", MmaFlavor::name)
        )?;
        if self.stages != Stages::All {
            write!(f, ", stages={}", self.stages.name())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::caps::{CapsRequest, IndexSpace, Precision};
    use super::super::layout::RegionId;
    use super::super::{SELECT_CANDIDATES, SELECT_STATE_WORDS};
    use super::*;
    use crate::tensor::Device;

    fn sms(multiprocessors: u32) -> DeviceFacts {
        DeviceFacts { multiprocessors, compute_capability: (9, 0) }
    }

    fn caps(heads: i64, rows: i64, width: i64, topk: i64, supertile: i64, mode: Mode) -> Caps {
        Caps::new(&CapsRequest {
            device: Device::Cuda(0),
            num_q_heads: heads,
            max_q_rows: rows,
            max_page_table_width: width,
            topk,
            mode,
            index_space: IndexSpace::Logical,
            page_size: 64,
            supertile_tokens: supertile,
            precision: Precision::Exact,
        })
        .unwrap()
    }

    #[test]
    fn spec_pinned_small_supertile_example() {
        // reference §4.4: H=64, R=2, W=16, K=512, explicit S=512 -> 2 chunks
        let p = Plan::new(&caps(64, 2, 16, 512, 512, Mode::Decode), &sms(188)).unwrap();
        assert_eq!(p.route(), Route::PagedDecode);
        assert_eq!(p.supertile(), 512);
        assert_eq!(p.max_chunks(), 2);
        assert_eq!(p.layout().region(RegionId::Logits).shape.as_slice(), &[2, 512]);
    }

    #[test]
    fn carry_keeps_two_halves_whatever_the_chunk_count() {
        // reference §4.4: R=16, W=1056, S=8192; 1056 pages bucket to 1280 -> 10 chunks
        let p = Plan::new(&caps(64, 16, 1056, 512, 8192, Mode::Decode), &sms(188)).unwrap();
        assert_eq!(p.width_capacity(), 1280);
        assert_eq!(p.max_chunks(), 10);
        assert_eq!(p.layout().region(RegionId::CarryValues).shape.as_slice(), &[2, 16, 512]);
        assert_eq!(p.layout().region(RegionId::CarryIndices).shape.as_slice(), &[2, 16, 512]);
    }

    #[test]
    fn default_supertile_follows_the_width_then_caps_at_32768() {
        let s = |w| Plan::new(&caps(64, 1, w, 512, 0, Mode::Prefill), &sms(1)).unwrap();
        assert_eq!((s(1).supertile(), s(1).max_chunks()), (512, 1));
        assert_eq!((s(9).supertile(), s(9).max_chunks()), (1024, 1)); // 10 pages = 640 rows
        assert_eq!((s(512).supertile(), s(512).max_chunks()), (32768, 1));
        assert_eq!((s(1024).supertile(), s(1024).max_chunks()), (32768, 2));
        assert_eq!((s(4096).supertile(), s(4096).max_chunks()), (32768, 8));
    }

    #[test]
    fn decode_supertile_takes_the_width_within_the_logits_budget() {
        let s = |r, w| Plan::new(&caps(64, r, w, 512, 0, Mode::Decode), &sms(132)).unwrap();
        // 1 row x 2048 pages: one chunk of 131072, 16 slices of 8192
        assert_eq!((s(1, 2048).supertile(), s(1, 2048).max_chunks()), (131072, 1));
        assert_eq!(s(1, 2048).topk_slices(), 16);
        // 64 rows: 2^23 / 64 = 131072 tokens per row still fit
        assert_eq!((s(64, 512).supertile(), s(64, 512).topk_slices()), (32768, 1));
        assert_eq!(s(64, 4096).supertile(), 131072);
        // 4096 rows: the budget is below 32768, which stays the floor
        assert_eq!((s(4096, 4096).supertile(), s(4096, 4096).max_chunks()), (32768, 8));
        // slices never below 8192 tokens, never more than SMs / (2 rows)
        assert_eq!(s(16, 1024).topk_slices(), 4);
        assert_eq!(s(1, 100).topk_slices(), 1);
    }

    #[test]
    fn heads_pad_to_sixteen_and_mode_picks_the_route() {
        let p = Plan::new(&caps(17, 1, 8, 1024, 0, Mode::Prefill), &sms(1)).unwrap();
        assert_eq!(p.heads_padded(), 32);
        assert_eq!(p.route(), Route::SharedPrefill);
        assert_eq!(p.route().name(), "packed_contiguous");
    }

    #[test]
    fn scratch_scales_with_rows_and_stops_growing_with_width_past_one_supertile() {
        let n = |r, w| Plan::new(&caps(64, r, w, 512, 0, Mode::Prefill), &sms(1)).unwrap().nbytes();
        assert!(n(2, 1024) > n(1, 1024));
        assert_eq!(n(1, 512), n(1, 4096));
        assert!(n(1, 64) < n(1, 512));
        // prefill R=1, W=4096, K=512: logits 128 KiB, carries 2x4 KiB, row_state 64 B
        assert_eq!(n(1, 4096), 131072 + 4096 + 4096 + 64);
    }

    #[test]
    fn only_one_chunk_decode_plans_that_fit_one_wave_hold_the_grid_selection_state() {
        let state = |rows, width, mode, facts: &DeviceFacts| {
            let p = Plan::new(&caps(64, rows, width, 512, 0, mode), facts).unwrap();
            let words = p.layout().region(RegionId::RowState).shape[1];
            assert_eq!(words == SELECT_STATE_WORDS, p.grid_select_state());
            let cands = p.layout().region(RegionId::SelectCandidates).shape.clone();
            let expect: &[u64] =
                if p.grid_select_state() { &[rows as u64, SELECT_CANDIDATES] } else { &[0] };
            assert_eq!(cands.as_slice(), expect);
            p.grid_select_state()
        };
        // one row of 131072 logits, 32 rows (4 CTAs each: 128 of 132 SMs): yes
        assert!(state(1, 2048, Mode::Decode, &sms(132)));
        assert!(state(32, 512, Mode::Decode, &sms(132)));
        // 64 rows (or 33, bucketed to 64), fewer SMs, prefill, one SM: no
        assert!(!state(64, 512, Mode::Decode, &sms(132)));
        assert!(!state(32, 512, Mode::Decode, &sms(127)));
        assert!(!state(1, 512, Mode::Prefill, &sms(132)));
        assert!(!state(1, 512, Mode::Decode, &sms(1)));
    }

    #[test]
    fn zero_multiprocessors_is_rejected() {
        assert!(Plan::new(&caps(64, 1, 1, 512, 0, Mode::Decode), &sms(0)).is_err());
    }

    #[test]
    fn the_tma_flavor_serves_a_bounded_number_of_row_blocks() {
        let on = DeviceFacts { multiprocessors: 132, compute_capability: (9, 0) };
        let fast =
            |rows, mode| Caps { precision: Precision::Fast, ..caps(64, rows, 8, 512, 0, mode) };
        let flavor = |rows, mode| Plan::new(&fast(rows, mode), &on).unwrap().mma_flavor();
        // decode blocks are one row, prefill blocks eight
        assert_eq!(flavor(4096, Mode::Decode), Some(MmaFlavor::TmaFp8));
        assert_eq!(flavor(5120, Mode::Decode), Some(MmaFlavor::WgmmaFp8));
        assert_eq!(flavor(32768, Mode::Prefill), Some(MmaFlavor::TmaFp8));
        assert_eq!(flavor(40960, Mode::Prefill), Some(MmaFlavor::WgmmaFp8));
        let forced = PlanOptions { mma_flavor: Some(MmaFlavor::TmaFp8), ..PlanOptions::default() };
        let err = Plan::with_options(&fast(5120, Mode::Decode), &on, &forced).unwrap_err();
        assert!(err.to_string().contains("serves 5120 decode rows"), "{err}");
        assert!(Plan::with_options(&fast(4096, Mode::Decode), &on, &forced).is_ok());
    }

    #[test]
    fn exact_on_hopper_takes_the_tma_f16_scorers_where_they_serve() {
        let on = DeviceFacts { multiprocessors: 132, compute_capability: (9, 0) };
        let exact = |rows, mode| caps(64, rows, 8, 512, 0, mode);
        let flavor = |rows, mode| Plan::new(&exact(rows, mode), &on).unwrap().mma_flavor();
        // decode blocks are one row, prefill blocks eight
        assert_eq!(flavor(4096, Mode::Decode), Some(MmaFlavor::TmaF16));
        assert_eq!(flavor(32768, Mode::Prefill), Some(MmaFlavor::TmaF16));
        // past the work scan's row blocks: the wgmma scorer of the same precision
        assert_eq!(flavor(5120, Mode::Decode), Some(MmaFlavor::Wgmma));
        assert_eq!(flavor(40960, Mode::Prefill), Some(MmaFlavor::Wgmma));
        assert!(MmaFlavor::TmaF16.is_exact());
        assert_eq!(MmaFlavor::TmaF16.fallback(), MmaFlavor::Wgmma);
        assert_eq!(MmaFlavor::parse("tma_f16").unwrap(), MmaFlavor::TmaF16);
        let forced = PlanOptions { mma_flavor: Some(MmaFlavor::TmaF16), ..PlanOptions::default() };
        let err = Plan::with_options(&exact(40960, Mode::Prefill), &on, &forced).unwrap_err();
        assert!(err.to_string().contains("serves 40960 prefill rows"), "{err}");
        // `b12x bench indexer --flavor-arms` skips an arm on this wording
        assert!(err.to_string().contains("mma_flavor expected a flavor that serves"), "{err}");
        let p = Plan::with_options(&exact(64, Mode::Decode), &on, &forced).unwrap();
        assert!(p.to_string().ends_with("mma_flavor=tma_f16"), "{p}");
        // elsewhere exact keeps its flavor
        let off = DeviceFacts { multiprocessors: 132, compute_capability: (12, 0) };
        let p = Plan::new(&exact(4096, Mode::Prefill), &off).unwrap();
        assert_eq!(p.mma_flavor(), Some(MmaFlavor::E4m3));
    }

    #[test]
    fn the_plan_resolves_the_mma_flavor() {
        let c = caps(64, 1, 8, 512, 0, Mode::Decode);
        let on = |cc| DeviceFacts { multiprocessors: 132, compute_capability: cc };
        let flavor = |cc| Plan::new(&c, &on(cc)).unwrap().mma_flavor();
        assert_eq!(flavor((9, 0)), Some(MmaFlavor::TmaF16));
        assert_eq!(flavor((8, 9)), Some(MmaFlavor::E4m3));
        assert_eq!(flavor((12, 0)), Some(MmaFlavor::E4m3));
        assert_eq!(flavor((10, 0)), Some(MmaFlavor::F16));
        // fast: FP8 wgmma on Hopper; elsewhere there is no faster path, so exact
        let fast = Caps { precision: Precision::Fast, ..c };
        let flavor = |cc| Plan::new(&fast, &on(cc)).unwrap().mma_flavor();
        assert_eq!(flavor((9, 0)), Some(MmaFlavor::TmaFp8));
        assert_eq!(flavor((12, 0)), Some(MmaFlavor::E4m3));
        assert_eq!(flavor((10, 0)), Some(MmaFlavor::F16));
        let p = Plan::new(&fast, &on((9, 0))).unwrap();
        assert!(p.to_string().ends_with("precision=fast, mma_flavor=tma_fp8"));
        assert!(!MmaFlavor::WgmmaFp8.is_exact() && MmaFlavor::Wgmma.is_exact());
        assert!(!MmaFlavor::TmaFp8.is_exact());
        let forced = PlanOptions { mma_flavor: Some(MmaFlavor::E4m3), ..PlanOptions::default() };
        let p = Plan::with_options(&c, &on((9, 0)), &forced).unwrap();
        assert_eq!(p.mma_flavor(), Some(MmaFlavor::E4m3));
        assert!(p.to_string().ends_with("mma_flavor=e4m3"));
        let cpu = Caps { device: Device::Cpu, ..c };
        let p = Plan::new(&cpu, &DeviceFacts::CPU).unwrap();
        assert_eq!(p.mma_flavor(), None);
        assert!(p.to_string().ends_with("mma_flavor=reference"));
        let err = Plan::with_options(&cpu, &DeviceFacts::CPU, &forced).unwrap_err();
        assert_eq!(
            err.to_string(),
            "plan: mma_flavor expected None on a CPU plan (the reference runs there), got \"e4m3\""
        );
        assert_eq!(MmaFlavor::parse("wgmma").unwrap(), MmaFlavor::Wgmma);
        for stages in [Stages::TopkOnly, Stages::ScoreOnly] {
            let stage = PlanOptions { stages, ..PlanOptions::default() };
            let p = Plan::with_options(&c, &on((9, 0)), &stage).unwrap();
            assert_eq!(p.stages(), stages);
            assert!(p.to_string().ends_with(&format!(", stages={}", stages.name())));
            assert!(Plan::with_options(&cpu, &DeviceFacts::CPU, &stage).is_err());
        }
        assert!(Stages::All.scores() && Stages::All.selects());
        assert!(!Stages::TopkOnly.scores() && !Stages::ScoreOnly.selects());
        assert!(MmaFlavor::parse("tf32").unwrap_err().to_string().contains("one of {e4m3"));
    }
}
