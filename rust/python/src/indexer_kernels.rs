//! Test-only entry to the indexer kernels with raw device pointers.
//!
//! `_indexer_launch_raw` exists so the kernels can be tested and benchmarked
//! before the planning layer (Caps/plan/bind/run) drives them; it trusts its
//! caller for every pointer and is not part of the public API.

use b12x_cuda::indexer::{launch_indexer, IndexerLaunch, MmaFlavor, Route};
use pyo3::prelude::*;

use crate::error::PyB12xResult;

/// Enqueues one indexer call from raw pointers (see `b12x_cuda::indexer::IndexerLaunch`);
/// `flavor`: 0 = the device's, 1 = e4m3 MMA, 2 = f16 MMA.
/// The caller guarantees every pointer; a wrong one is undefined behaviour.
#[pyfunction]
#[pyo3(signature = (
    device, stream, prefill, physical, rows, heads, width, topk, supertile, topk_slices,
    rows_cap, q, weights, kcache, page_stride, page_table, page_table_row_stride, lengths,
    active_width, out_indices, out_scores, logits, carry_values, carry_indices,
    partial_values, partial_indices, flavor = 0
))]
#[allow(clippy::too_many_arguments)]
fn _indexer_launch_raw(
    py: Python<'_>,
    device: u32,
    stream: u64,
    prefill: bool,
    physical: bool,
    rows: u32,
    heads: u32,
    width: u32,
    topk: u32,
    supertile: u32,
    topk_slices: u32,
    rows_cap: u32,
    q: u64,
    weights: u64,
    kcache: u64,
    page_stride: u64,
    page_table: u64,
    page_table_row_stride: u64,
    lengths: u64,
    active_width: u64,
    out_indices: u64,
    out_scores: u64,
    logits: u64,
    carry_values: u64,
    carry_indices: u64,
    partial_values: u64,
    partial_indices: u64,
    flavor: u32,
) -> PyB12xResult<()> {
    let launch = IndexerLaunch {
        device,
        stream,
        route: if prefill { Route::SharedPrefill } else { Route::PagedDecode },
        physical,
        flavor: match flavor {
            1 => Some(MmaFlavor::E4m3),
            2 => Some(MmaFlavor::F16),
            _ => None,
        },
        rows,
        heads,
        width,
        topk,
        supertile,
        topk_slices,
        rows_cap,
        q,
        weights,
        kcache,
        page_stride,
        page_table,
        page_table_row_stride,
        lengths,
        active_width,
        out_indices,
        out_scores,
        logits,
        carry_values,
        carry_indices,
        partial_values,
        partial_indices,
    };
    // SAFETY: test-only; the caller (b12x._indexer_raw) passes pointers of
    // live torch tensors sized for these shapes.
    py.detach(|| unsafe { launch_indexer(&launch) })?;
    Ok(())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_indexer_launch_raw, m)?)?;
    Ok(())
}
