//! The planning layer of the C4 sparse indexer (paged FP8 scoring -> exact top-k).
//!
//! Lifecycle: [`Caps`] (what the caller declares) -> [`Plan`] (immutable,
//! `Arc`-shared, interned by bucketed caps) -> [`Binding`] (one call's live
//! tensors checked against the plan, reduced to [`IndexerArgs`]) -> a launcher
//! in b12x-cuda. Nothing here allocates device memory, launches or syncs.
//!
//! # Bucketed capacities
//!
//! A plan's row and page-table-width capacities are the caller's values
//! rounded up by [`bucket`]: exact up to 8, then the next value of the form
//! m·2^k with m in {4, 5, 6, 7} (8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ...).
//! So a capacity is never more than 25% above the request, every power of
//! two stays exact (the vLLM profile width ceil(65536/64) = 1024 is its own
//! bucket), a plan for capacity C serves every call <= C, and the number of
//! distinct plans for N live sizes grows like 4·log2(N) per dimension
//! (at most 8 + 4·17 = 76 row buckets below the 2^20 row limit), so a server
//! whose prefill chunk sizes vary cannot grow the plan cache without bound.

mod bind;
mod bucket;
mod cache;
mod caps;
mod fault;
mod layout;
mod plan;

pub use bind::{bind, changed_operand, check_output_grad, Binding, IndexerArgs, Operands};
pub use bucket::bucket;
pub use cache::InternCache;
pub use caps::{
    check_device, cuda_ordinal, Caps, CapsRequest, IndexSpace, Mode, Precision, MAX_CUDA_ORDINAL,
};
pub use fault::{record_host_fault, take_host_fault, PageFault, STATUS_WORDS};
pub use layout::{LayoutInput, Region, RegionId, RegionShape, ScratchLayout, REGION_ALIGN};
pub use plan::{DeviceFacts, MmaFlavor, Plan, PlanOptions, Route, Stages};

/// Compressed K rows per page of the index cache.
pub const PAGE_SIZE: u32 = 64;
/// Elements per index-query / index-key head.
pub const HEAD_DIM: u32 = 128;
/// Bytes of one page: 64 rows x 128 FP8 values, then 64 fp32 scales (planar).
pub const PAGE_BYTES: u64 = (PAGE_SIZE * (HEAD_DIM + 4)) as u64;
/// Byte offset of the fp32 scales inside a page.
pub const SCALE_OFFSET: u64 = (PAGE_SIZE * HEAD_DIM) as u64;
/// The top-k sizes the selection kernels are built for.
pub const SUPPORTED_TOPK: [u32; 3] = [512, 1024, 2048];
/// Most query heads a plan accepts; kernels pad heads to multiples of 16.
pub const MAX_HEADS: u32 = 64;
/// Head tile of the FP8 MMA (m16n8k32): heads are padded to a multiple of it.
pub const HEAD_TILE: u32 = 16;
/// Largest `max_q_rows`; keeps every scratch size far inside 64 bits.
pub const MAX_Q_ROWS: u32 = 1 << 20;
/// Largest `max_page_table_width` (pages); width·64 stays below 2^31, so a
/// logical index always fits the int32 output.
pub const MAX_PAGE_TABLE_WIDTH: u32 = 1 << 24;
/// Default K rows scored per chunk (the supertile).
pub const DEFAULT_SUPERTILE: u32 = 32768;
/// Supertiles are whole multiples of this many K rows.
pub const SUPERTILE_QUANTUM: u32 = 512;
/// f32 elements the logits region of a decode plan may take by default: few
/// rows get a supertile covering the whole width (no serial carry chain).
pub const DECODE_LOGITS_BUDGET: u64 = 1 << 23;
/// Smallest slice of the two-stage top-k (phase 1 reduces each slice to topk).
pub const TOPK_SLICE_MIN: u32 = 8192;
/// Words of one row's cross-CTA state for the grid selection of one-chunk
/// plans with few rows (`SG_STATE_WORDS` in kernels/indexer_select.cu): three
/// levels' histograms of 2048 bins, counters, per-CTA counts.
pub const SELECT_STATE_WORDS: u64 = 6400;
/// Candidates one row of the grid selection gathers (`SG_CAND_CAP`): the
/// keys in the bin of the k-th key's top 11 bits, when it holds no more, which
/// the row's last CTA selects from (a few hundred of 131072 bench logits).
pub const SELECT_CANDIDATES: u64 = 14336;
/// Fewest CTAs of one row's grid selection: a CUDA decode plan of one chunk
/// holds its row state when rows x this many CTAs fit one wave of the
/// device's SMs (more rows fill the GPU with one cluster per row).
pub const GRID_SELECT_MIN_PARTS: u32 = 4;
/// Largest explicit supertile.
pub const MAX_SUPERTILE: u32 = 65536;
/// Query rows of one row block of the TMA-fed prefill scorer (decode blocks
/// are one row).
pub const TMA_PREFILL_BLOCK_ROWS: u32 = 8;
/// Row blocks the TMA-fed scorers' work scan holds; a plan with more keeps
/// the wgmma scorers.
pub const TMA_MAX_ROW_BLOCKS: u32 = 4096;
