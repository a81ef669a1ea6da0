//! `bind`: one call's live tensors checked against a plan and reduced to the
//! plain values a launcher needs ([`IndexerArgs`]).
//!
//! Bind reads metadata only: it never touches tensor memory, allocates,
//! launches or syncs, and it leaves the plan as it was. Live device values
//! (lengths, page ids, active width) are not read here; they only bound the
//! work the kernels do (reference spec §2, §4.5).

use std::sync::Arc;

use arrayvec::ArrayVec;

use super::caps::{IndexSpace, Mode};
use super::layout::RegionId;
use super::plan::Plan;
use super::{HEAD_DIM, PAGE_BYTES, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::tensor::{DType, Device, TensorMeta};
use crate::validate::Operand;

const OP: &str = "bind";
/// Vector loads and stores (q rows, K pages, output rows) need 16-byte alignment.
const VECTOR_ALIGN: u64 = 16;
/// Physical indices `page*64 + slot` must fit an int32.
const MAX_PHYSICAL_PAGES: u64 = (i32::MAX as u64 + 1) / PAGE_SIZE as u64;

/// The operands of one call, as metadata.
#[derive(Debug, Clone, Copy)]
pub struct Operands<'a> {
    pub scratch: &'a TensorMeta,
    pub q_fp8: &'a TensorMeta,
    pub query_weights: &'a TensorMeta,
    pub index_k_cache: &'a TensorMeta,
    pub page_table: &'a TensorMeta,
    pub cache_lengths: &'a TensorMeta,
    pub active_width: &'a TensorMeta,
    pub output_indices: &'a TensorMeta,
    pub output_scores: Option<&'a TensorMeta>,
}

/// What a launcher needs, as plain values. Addresses are device addresses of
/// element 0; every byte quantity is 64-bit. No kernel takes it as is: the
/// launcher fills each kernel's own parameter block from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexerArgs {
    /// CUDA ordinal (u32::MAX for a CPU binding, which is never launched).
    pub device: u32,
    pub rows: u32,
    pub heads: u32,
    /// Live page-table width in pages (<= the plan's capacity).
    pub width: u32,
    pub topk: u32,
    /// fp8 e4m3 [rows, heads, 128], contiguous.
    pub q: u64,
    /// f32 [rows, heads], contiguous.
    pub weights: u64,
    /// u8 base of page 0 of the index K cache.
    pub kcache: u64,
    /// Bytes between pages: >= 8448 and a multiple of 16.
    pub page_stride: u64,
    /// i32 page table.
    pub page_table: u64,
    /// Elements between page-table rows; 0 = every query row reads row 0.
    pub page_table_row_stride: u64,
    /// i32 [rows].
    pub lengths: u64,
    /// i32 [1].
    pub active_width: u64,
    /// i32 [rows, topk], contiguous.
    pub out_indices: u64,
    /// f32 [rows, topk], contiguous, or 0 when the caller wants no scores.
    pub out_scores: u64,
    /// Scratch base; region offsets come from the plan's layout.
    pub scratch: u64,
    /// Pages of the K cache (`index_k_cache.shape[0]`): the kernels treat a
    /// page id outside `[0, pages)` as unmapped and report it.
    pub pages: u64,
}

/// A plan plus one call's live sizes and addresses.
#[derive(Debug, Clone)]
pub struct Binding {
    plan: Arc<Plan>,
    args: IndexerArgs,
}

impl Binding {
    #[inline]
    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }
    #[inline]
    pub fn args(&self) -> &IndexerArgs {
        &self.args
    }
    #[inline]
    pub fn rows(&self) -> u32 {
        self.args.rows
    }
    #[inline]
    pub fn width(&self) -> u32 {
        self.args.width
    }
    /// Device address of a scratch region.
    #[inline]
    pub fn region_address(&self, id: RegionId) -> u64 {
        self.args.scratch + self.plan.layout().region(id).offset
    }
}

fn over_capacity(operand: String, limit: u32, got: u64, field: &str) -> Error {
    Error::Capacity {
        op: OP,
        operand: operand.into(),
        limit: limit as u64,
        got,
        hint: format!("the plan's {field} capacity is {limit}; make a plan with {field} >= {got}")
            .into(),
    }
}

fn dim(meta: &TensorMeta, i: usize) -> u64 {
    meta.shape[i].max(0) as u64
}

/// The bytes `[start, end)` of one operand, and whether the kernels write them.
#[derive(Clone, Copy)]
struct Span {
    name: &'static str,
    range: (u64, u64),
    written: bool,
}

impl Span {
    /// The operand's whole strided view (its checks have passed).
    fn of(check: &Operand<'_>, name: &'static str, written: bool) -> Result<Span> {
        let range = check.byte_range()?;
        if range.0 == 0 && range.1 > 0 {
            return Err(Error::InvalidValue {
                op: OP,
                operand: name.into(),
                expected: "a non-null data pointer".into(),
                got: format!("address 0x0 for {} bytes", range.1),
            });
        }
        Ok(Span { name, range, written })
    }

    fn overlaps(&self, other: &Span) -> bool {
        let ((a0, a1), (b0, b1)) = (self.range, other.range);
        a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1
    }
}

/// Every written span is disjoint from every other span; read-only operands
/// may alias each other. Cost: (written spans) x (spans) comparisons, so
/// O(#operands), on the stack.
fn check_disjoint(spans: &[Span]) -> Result<()> {
    for (i, w) in spans.iter().enumerate().filter(|(_, s)| s.written) {
        for (j, other) in spans.iter().enumerate() {
            // a pair of writers is reported once, by the later one (the order
            // of `spans`: inputs, scratch, output_indices, output_scores)
            let seen = other.written && j > i;
            if j != i && !seen && w.overlaps(other) {
                return Err(Error::Overlap {
                    op: OP,
                    operand: w.name.into(),
                    other: other.name.into(),
                    range: w.range,
                    other_range: other.range,
                });
            }
        }
    }
    Ok(())
}

/// An output the kernels (or the CPU reference) write in place, outside
/// autograd, must not require grad: torch would refuse the write, or a
/// backward pass would silently miss it.
pub fn check_output_grad(operand: &'static str, requires_grad: bool) -> Result<()> {
    if requires_grad {
        return Err(Error::InvalidValue {
            op: "bind",
            operand: operand.into(),
            expected: "a tensor that does not require grad (b12x writes it in place, outside \
                       autograd; pass a detached tensor)"
                .into(),
            got: "requires_grad=True".into(),
        });
    }
    Ok(())
}

/// The operand whose bound values differ between two bindings of the same
/// tensors: what a tensor changed in place since `bind` (`resize_`, `set_`,
/// `.data =`) changed; None when they agree.
pub fn changed_operand(bound: &IndexerArgs, now: &IndexerArgs) -> Option<&'static str> {
    let fields: [(bool, &'static str); 11] = [
        (bound.q != now.q || bound.rows != now.rows || bound.heads != now.heads, "q_fp8"),
        (bound.weights != now.weights, "query_weights"),
        (
            bound.kcache != now.kcache
                || bound.page_stride != now.page_stride
                || bound.pages != now.pages,
            "index_k_cache",
        ),
        (
            bound.page_table != now.page_table
                || bound.page_table_row_stride != now.page_table_row_stride
                || bound.width != now.width,
            "page_table",
        ),
        (bound.lengths != now.lengths, "cache_lengths"),
        (bound.active_width != now.active_width, "active_width"),
        (bound.out_indices != now.out_indices, "output_indices"),
        (bound.out_scores != now.out_scores, "output_scores"),
        (bound.scratch != now.scratch, "scratch"),
        (bound.topk != now.topk, "output_indices"),
        (bound.device != now.device, "q_fp8"),
    ];
    fields.iter().find(|(changed, _)| *changed).map(|&(_, name)| name)
}

/// Checks every operand against `plan` (reference spec §2, §4.5) and returns
/// the binding. Errors name the operand and give expected vs actual values.
pub fn bind(plan: &Arc<Plan>, ops: &Operands<'_>) -> Result<Binding> {
    let caps = plan.caps();
    let device = caps.device;
    let heads = caps.num_q_heads as i64;
    let topk = caps.topk as i64;

    // scratch: uint8, contiguous, large enough; it is never read or written here
    let scratch = Operand::new(OP, "scratch", ops.scratch);
    scratch.dtype(&[DType::U8])?.device(device)?.contiguous()?.aligned(VECTOR_ALIGN)?;
    let scratch_bytes = ops.scratch.numel();
    if scratch_bytes < plan.nbytes() {
        return Err(Error::Insufficient {
            op: OP,
            operand: "scratch".into(),
            need: plan.nbytes(),
            got: scratch_bytes,
            unit: "bytes (plan.nbytes)",
            hint: "size it with plan.scratch_specs() or plan.shapes_and_dtypes()".into(),
        });
    }
    let scratch_start = ops.scratch.address();
    // kernels touch only the first plan.nbytes bytes; the rest is the caller's
    let mut scratch_span = Span::of(&scratch, "scratch", true)?;
    scratch_span.range.1 = scratch_start + plan.nbytes();

    // q_fp8: [rows, heads, 128] e4m3, contiguous
    let q = Operand::new(OP, "q_fp8", ops.q_fp8);
    q.dtype(&[DType::F8E4M3])?.device(device)?.rank(3)?;
    q.shape(&[None, Some(heads), Some(HEAD_DIM as i64)])?.contiguous()?.aligned(VECTOR_ALIGN)?;
    let q_span = Span::of(&q, "q_fp8", false)?;
    let rows = dim(ops.q_fp8, 0);
    if rows > plan.rows_capacity() as u64 {
        return Err(over_capacity(
            "q_fp8.shape[0] (rows)".into(),
            plan.rows_capacity(),
            rows,
            "max_q_rows",
        ));
    }
    let r = rows as i64;

    // query_weights: f32 [rows, heads] or [rows, heads, 1], contiguous
    let w = Operand::new(OP, "query_weights", ops.query_weights);
    w.dtype(&[DType::F32])?.device(device)?.rank_in(2, 3)?;
    let wshape = &ops.query_weights.shape;
    if wshape[0] != r || wshape[1] != heads || (wshape.len() == 3 && wshape[2] != 1) {
        return Err(w.shape_error(format!("({r}, {heads}) or ({r}, {heads}, 1)")));
    }
    w.contiguous()?.aligned(4)?;
    let w_span = Span::of(&w, "query_weights", false)?;

    // index_k_cache: u8 [pages, 8448], inner stride 1, page stride >= 8448
    let k = Operand::new(OP, "index_k_cache", ops.index_k_cache);
    k.dtype(&[DType::U8])?.device(device)?.rank(2)?.shape(&[None, Some(PAGE_BYTES as i64)])?;
    let kstrides = &ops.index_k_cache.strides;
    if kstrides[1] != 1 {
        return Err(k.layout_error("inner stride 1 (the 8448 bytes of a page contiguous)"));
    }
    let page_stride = kstrides[0];
    if page_stride < PAGE_BYTES as i64 {
        return Err(k.layout_error("a page stride >= 8448 bytes (any larger stride is fine)"));
    }
    if page_stride as u64 % VECTOR_ALIGN != 0 {
        return Err(k.layout_error("a page stride that is a multiple of 16 bytes"));
    }
    k.aligned(VECTOR_ALIGN)?;
    let k_span = Span::of(&k, "index_k_cache", false)?;
    let pages = dim(ops.index_k_cache, 0);
    if caps.index_space == IndexSpace::Physical && pages > MAX_PHYSICAL_PAGES {
        return Err(Error::Capacity {
            op: OP,
            operand: "index_k_cache.shape[0] (pages)".into(),
            limit: MAX_PHYSICAL_PAGES,
            got: pages,
            hint: "physical indices page*64+slot must fit int32".into(),
        });
    }

    // page_table: i32 [rows, width]; decode: one row per query row;
    // prefill: one row shared by every query row (stride 0)
    let pt = Operand::new(OP, "page_table", ops.page_table);
    pt.dtype(&[DType::I32])?.device(device)?.rank(2)?.shape(&[Some(r), None])?;
    let width = dim(ops.page_table, 1);
    if width == 0 {
        return Err(pt.shape_error(format!("({r}, >= 1)")));
    }
    if width > plan.width_capacity() as u64 {
        return Err(over_capacity(
            "page_table.shape[1] (width)".into(),
            plan.width_capacity(),
            width,
            "max_page_table_width",
        ));
    }
    let pstrides = &ops.page_table.strides;
    let per_row = ops.page_table.is_contiguous();
    let shared = rows > 1 && pstrides[0] == 0 && (pstrides[1] == 1 || width == 1);
    let row_stride = match caps.mode {
        Mode::Decode if per_row => {
            if rows <= 1 {
                0
            } else {
                width
            }
        }
        Mode::Decode if shared => {
            return Err(pt.layout_error(
                "contiguous (a decode plan reads one page-table row per query row; a \
                 row-shared stride-0 table is accepted only by prefill plans)",
            ))
        }
        Mode::Prefill if shared || (rows <= 1 && per_row) => 0,
        Mode::Prefill if per_row => {
            return Err(pt.layout_error(
                "row-shared (0, 1) (a prefill plan reads one request's page-table row for \
                 every query row: table[:1].expand(rows, width))",
            ))
        }
        Mode::Decode => return Err(pt.layout_error("contiguous (row-major)")),
        Mode::Prefill => {
            return Err(pt.layout_error("row-shared (0, 1), as table[:1].expand(rows, width)"))
        }
    };
    pt.aligned(4)?;
    let pt_span = Span::of(&pt, "page_table", false)?;

    let lens = Operand::new(OP, "cache_lengths", ops.cache_lengths);
    lens.dtype(&[DType::I32])?.device(device)?.rank(1)?.shape(&[Some(r)])?;
    lens.contiguous()?.aligned(4)?;
    let lens_span = Span::of(&lens, "cache_lengths", false)?;

    let aw = Operand::new(OP, "active_width", ops.active_width);
    aw.dtype(&[DType::I32])?.device(device)?.rank(1)?.shape(&[Some(1)])?.aligned(4)?;
    let aw_span = Span::of(&aw, "active_width", false)?;

    let oi = Operand::new(OP, "output_indices", ops.output_indices);
    oi.dtype(&[DType::I32])?.device(device)?.rank(2)?.shape(&[Some(r), Some(topk)])?;
    oi.contiguous()?.aligned(VECTOR_ALIGN)?;
    let oi_span = Span::of(&oi, "output_indices", true)?;

    let mut out_scores = 0;
    let mut os_span = None;
    if let Some(meta) = ops.output_scores {
        let os = Operand::new(OP, "output_scores", meta);
        os.dtype(&[DType::F32])?.device(device)?.rank(2)?.shape(&[Some(r), Some(topk)])?;
        os.contiguous()?.aligned(VECTOR_ALIGN)?;
        os_span = Some(Span::of(&os, "output_scores", true)?);
        out_scores = meta.address();
    }

    // what the kernels write never shares a byte with anything else they touch
    let mut spans: ArrayVec<Span, 9> = ArrayVec::new();
    spans.extend([q_span, w_span, k_span, pt_span, lens_span, aw_span, scratch_span, oi_span]);
    spans.extend(os_span);
    check_disjoint(&spans)?;

    let args = IndexerArgs {
        device: match device {
            Device::Cuda(ordinal) => ordinal,
            _ => u32::MAX,
        },
        rows: rows as u32,
        heads: caps.num_q_heads,
        width: width as u32,
        topk: caps.topk,
        q: ops.q_fp8.address(),
        weights: ops.query_weights.address(),
        kcache: ops.index_k_cache.address(),
        page_stride: page_stride as u64,
        page_table: ops.page_table.address(),
        page_table_row_stride: row_stride,
        lengths: ops.cache_lengths.address(),
        active_width: ops.active_width.address(),
        out_indices: ops.output_indices.address(),
        out_scores,
        scratch: scratch_start,
        pages,
    };
    Ok(Binding { plan: plan.clone(), args })
}

#[cfg(test)]
mod tests {
    use super::super::caps::{Caps, CapsRequest, Precision};
    use super::super::plan::DeviceFacts;
    use super::*;

    struct Fixture {
        scratch: TensorMeta,
        q: TensorMeta,
        w: TensorMeta,
        k: TensorMeta,
        pt: TensorMeta,
        lens: TensorMeta,
        aw: TensorMeta,
        oi: TensorMeta,
        os: TensorMeta,
    }

    fn t(dtype: DType, shape: &[i64], addr: u64) -> TensorMeta {
        TensorMeta {
            dtype,
            device: Device::Cuda(0),
            shape: shape.iter().copied().collect(),
            strides: TensorMeta::contiguous_strides(shape),
            data_ptr: addr,
            byte_offset: 0,
        }
    }

    fn plan(mode: Mode, space: IndexSpace) -> Arc<Plan> {
        let caps = Caps::new(&CapsRequest {
            device: Device::Cuda(0),
            num_q_heads: 16,
            max_q_rows: 4,
            max_page_table_width: 8,
            topk: 512,
            mode,
            index_space: space,
            page_size: 64,
            supertile_tokens: 0,
            precision: Precision::Exact,
        })
        .unwrap();
        let device = DeviceFacts { multiprocessors: 132, compute_capability: (9, 0) };
        Arc::new(Plan::new(&caps, &device).unwrap())
    }

    fn fixture(rows: i64, width: i64) -> Fixture {
        let mut k = t(DType::U8, &[10, 8448], 0x100_0000);
        k.strides[0] = 1_077_120; // a packed multi-group stride seen in serving
        Fixture {
            scratch: t(DType::U8, &[1 << 20], 0x1000_0000),
            q: t(DType::F8E4M3, &[rows, 16, 128], 0x2000_0000),
            w: t(DType::F32, &[rows, 16, 1], 0x3000_0000),
            k,
            pt: t(DType::I32, &[rows, width], 0x4000_0000),
            lens: t(DType::I32, &[rows], 0x5000_0000),
            aw: t(DType::I32, &[1], 0x6000_0000),
            oi: t(DType::I32, &[rows, 512], 0x7000_0000),
            os: t(DType::F32, &[rows, 512], 0x8000_0000),
        }
    }

    impl Fixture {
        fn ops(&self) -> Operands<'_> {
            Operands {
                scratch: &self.scratch,
                q_fp8: &self.q,
                query_weights: &self.w,
                index_k_cache: &self.k,
                page_table: &self.pt,
                cache_lengths: &self.lens,
                active_width: &self.aw,
                output_indices: &self.oi,
                output_scores: Some(&self.os),
            }
        }
    }

    fn bind_err(p: &Arc<Plan>, f: &Fixture) -> String {
        bind(p, &f.ops()).unwrap_err().to_string()
    }

    #[test]
    fn a_changed_operand_is_named() {
        let bound = IndexerArgs { q: 0x1000, kcache: 0x2000, pages: 8, ..Default::default() };
        assert_eq!(changed_operand(&bound, &bound), None);
        let moved = IndexerArgs { kcache: 0x3000, ..bound };
        assert_eq!(changed_operand(&bound, &moved), Some("index_k_cache"));
        let shrunk = IndexerArgs { pages: 4, ..bound };
        assert_eq!(changed_operand(&bound, &shrunk), Some("index_k_cache"));
        assert!(check_output_grad("output_scores", false).is_ok());
        let e = check_output_grad("output_scores", true).unwrap_err().to_string();
        assert!(e.starts_with("bind: output_scores expected a tensor that does not require grad"));
    }

    #[test]
    fn valid_operands_become_launch_args() {
        let p = plan(Mode::Decode, IndexSpace::Logical);
        let f = fixture(3, 5);
        let b = bind(&p, &f.ops()).unwrap();
        let a = b.args();
        assert_eq!((a.device, a.rows, a.heads, a.width, a.topk), (0, 3, 16, 5, 512));
        assert_eq!(a.page_stride, 1_077_120);
        assert_eq!(a.page_table_row_stride, 5);
        assert_eq!(a.pages, 10);
        assert_eq!(
            (a.q, a.kcache, a.out_scores, a.scratch),
            (0x2000_0000, 0x100_0000, 0x8000_0000, 0x1000_0000)
        );
        assert_eq!(
            b.region_address(RegionId::CarryValues),
            0x1000_0000 + p.layout().region(RegionId::CarryValues).offset
        );
        assert!(Arc::ptr_eq(b.plan(), &p));
    }

    #[test]
    fn capacity_errors_name_the_plan_field() {
        let p = plan(Mode::Decode, IndexSpace::Logical);
        assert_eq!(
            bind_err(&p, &fixture(5, 5)),
            "bind: q_fp8.shape[0] (rows) expected at most 4, got 5; the plan's max_q_rows \
             capacity is 4; make a plan with max_q_rows >= 5"
        );
        assert!(bind_err(&p, &fixture(2, 9))
            .starts_with("bind: page_table.shape[1] (width) expected at most 8, got 9"));
    }

    #[test]
    fn shared_page_table_only_in_prefill() {
        let mut f = fixture(3, 5);
        f.pt.strides[0] = 0;
        let decode = plan(Mode::Decode, IndexSpace::Logical);
        assert!(bind_err(&decode, &f).contains("accepted only by prefill plans"));
        let prefill = plan(Mode::Prefill, IndexSpace::Logical);
        assert_eq!(bind(&prefill, &f.ops()).unwrap().args().page_table_row_stride, 0);
        // a per-row table is not what a prefill plan reads
        let g = fixture(3, 5);
        assert!(bind_err(&prefill, &g).contains("row-shared (0, 1)"));
        // one row is both
        let one = fixture(1, 5);
        assert_eq!(bind(&prefill, &one.ops()).unwrap().args().page_table_row_stride, 0);
        assert_eq!(bind(&decode, &one.ops()).unwrap().args().page_table_row_stride, 0);
    }

    #[test]
    fn page_stride_rules() {
        let p = plan(Mode::Decode, IndexSpace::Logical);
        let mut f = fixture(2, 2);
        f.k.strides[0] = 8448;
        assert!(bind(&p, &f.ops()).is_ok());
        f.k.strides[0] = 8447;
        assert!(bind_err(&p, &f).contains("page stride >= 8448 bytes"));
        f.k.strides[0] = 8448 + 8;
        assert!(bind_err(&p, &f).contains("multiple of 16 bytes"));
        f.k.strides = [8448 * 2, 2].into_iter().collect();
        assert!(bind_err(&p, &f).contains("inner stride 1"));
    }

    #[test]
    fn physical_space_limits_page_count() {
        let p = plan(Mode::Decode, IndexSpace::Physical);
        let mut f = fixture(2, 2);
        f.k.shape[0] = (1 << 25) + 1;
        f.k.strides[0] = 8448;
        f.k.data_ptr = 1 << 48; // 283 GB of pages, clear of the other operands
        assert!(
            bind_err(&p, &f).contains("index_k_cache.shape[0] (pages) expected at most 33554432")
        );
        assert!(bind(&plan(Mode::Decode, IndexSpace::Logical), &f.ops()).is_ok());
    }

    #[test]
    fn scratch_size_alignment_and_overlap() {
        let p = plan(Mode::Decode, IndexSpace::Logical);
        let mut f = fixture(2, 2);
        f.scratch.shape[0] = p.nbytes() as i64 - 1;
        assert!(bind_err(&p, &f).starts_with(&format!(
            "bind: scratch expected at least {} bytes (plan.nbytes), got {}",
            p.nbytes(),
            p.nbytes() - 1
        )));
        f.scratch.shape[0] = p.nbytes() as i64;
        assert!(bind(&p, &f.ops()).is_ok());
        f.scratch.data_ptr += 8;
        assert!(bind_err(&p, &f).contains("scratch expected 16-byte alignment"));
        let mut g = fixture(2, 2);
        g.oi.data_ptr = g.scratch.data_ptr + 1024;
        assert!(bind_err(&p, &g).contains("output_indices expected memory disjoint from scratch"));
        let mut h = fixture(2, 2);
        h.os.data_ptr = h.oi.data_ptr + 16;
        assert!(
            bind_err(&p, &h).contains("output_scores expected memory disjoint from output_indices")
        );
    }

    #[test]
    fn written_operands_are_disjoint_from_every_input() {
        let p = plan(Mode::Decode, IndexSpace::Logical);
        // every (written, read) pair, the written operand placed over the read one
        type Address = fn(&Fixture) -> u64;
        let readers: [(&str, Address); 6] = [
            ("q_fp8", |f| f.q.data_ptr),
            ("query_weights", |f| f.w.data_ptr),
            ("index_k_cache", |f| f.k.data_ptr),
            ("page_table", |f| f.pt.data_ptr),
            ("cache_lengths", |f| f.lens.data_ptr),
            ("active_width", |f| f.aw.data_ptr),
        ];
        for (reader, addr) in readers {
            let mut f = fixture(2, 2);
            f.oi.data_ptr = addr(&f);
            let msg = bind_err(&p, &f);
            assert!(
                msg.starts_with(&format!(
                    "bind: output_indices expected memory disjoint from {reader}, got bytes"
                )),
                "{msg}"
            );
            let mut f = fixture(2, 2);
            f.os.data_ptr = addr(&f);
            assert!(bind_err(&p, &f)
                .contains(&format!("output_scores expected memory disjoint from {reader}")));
            let mut f = fixture(2, 2);
            f.scratch.data_ptr = addr(&f);
            assert!(bind_err(&p, &f)
                .contains(&format!("scratch expected memory disjoint from {reader}")));
        }
        // a little overlap is enough: the scratch's last used bytes on the cache's first
        let mut f = fixture(2, 2);
        f.scratch.data_ptr = (f.k.data_ptr - p.nbytes() + 1).next_multiple_of(16);
        assert!(bind_err(&p, &f).contains("scratch expected memory disjoint from index_k_cache"));
        // ... and touching ranges do not overlap
        let mut f = fixture(2, 2);
        f.scratch.data_ptr = f.k.data_ptr - p.nbytes().next_multiple_of(16);
        assert!(bind(&p, &f.ops()).is_ok());
    }

    #[test]
    fn the_message_gives_both_byte_ranges() {
        let p = plan(Mode::Decode, IndexSpace::Logical);
        let mut f = fixture(2, 2);
        f.oi.data_ptr = f.pt.data_ptr;
        assert_eq!(
            bind_err(&p, &f),
            "bind: output_indices expected memory disjoint from page_table, got bytes \
             [0x40000000, 0x40001000) overlapping page_table's bytes [0x40000000, 0x40000010)"
        );
    }

    #[test]
    fn inputs_may_alias_each_other_and_empty_outputs_alias_nothing() {
        let p = plan(Mode::Decode, IndexSpace::Logical);
        let mut f = fixture(2, 2);
        f.aw.data_ptr = f.lens.data_ptr; // active width read from the lengths' first word
        f.pt.data_ptr = f.lens.data_ptr;
        assert!(bind(&p, &f.ops()).is_ok());
        // zero rows: the outputs span no bytes, wherever they point
        let mut f = fixture(0, 2);
        f.oi.data_ptr = f.k.data_ptr;
        f.os.data_ptr = f.k.data_ptr;
        assert!(bind(&p, &f.ops()).is_ok());
        // the bytes of a larger scratch past plan.nbytes are the caller's
        let mut f = fixture(2, 2);
        f.scratch.shape[0] = (p.nbytes() + 4096) as i64;
        f.oi.data_ptr = f.scratch.data_ptr + p.nbytes().next_multiple_of(16);
        assert!(bind(&p, &f.ops()).is_ok());
    }

    #[test]
    fn strided_views_are_measured_by_their_whole_extent() {
        let p = plan(Mode::Decode, IndexSpace::Logical);
        // 10 pages 1_077_120 bytes apart: the output sits in the gap after page 3
        let mut f = fixture(2, 2);
        f.oi.data_ptr = f.k.data_ptr + 3 * 1_077_120 + 8448 + 16;
        assert!(
            bind_err(&p, &f).contains("output_indices expected memory disjoint from index_k_cache")
        );
        // past the last page's 8448 bytes it is free
        f.oi.data_ptr = f.k.data_ptr + 9 * 1_077_120 + 8448;
        assert!(bind(&p, &f.ops()).is_ok());
    }

    #[test]
    fn null_and_overflowing_addresses_are_refused() {
        let p = plan(Mode::Decode, IndexSpace::Logical);
        let mut f = fixture(2, 2);
        f.q.data_ptr = 0;
        assert_eq!(
            bind_err(&p, &f),
            "bind: q_fp8 expected a non-null data pointer, got address 0x0 for 4096 bytes"
        );
        let mut f = fixture(2, 2);
        f.oi.data_ptr = u64::MAX - 15; // aligned, but its 4 KiB run past 2^64
        assert!(bind_err(&p, &f).starts_with("bind: output_indices byte extent overflows 64 bits"));
        let mut f = fixture(2, 2);
        f.scratch.byte_offset = u64::MAX; // address saturates instead of wrapping
        assert!(bind(&p, &f.ops()).is_err());
    }

    #[test]
    fn shape_dtype_and_device_errors() {
        let p = plan(Mode::Decode, IndexSpace::Logical);
        let mut f = fixture(2, 2);
        f.q.shape[1] = 32;
        f.q.strides = TensorMeta::contiguous_strides(&f.q.shape);
        assert_eq!(bind_err(&p, &f), "bind: q_fp8 expected shape (*, 16, 128), got [2, 32, 128]");
        let mut f = fixture(2, 2);
        f.w.shape[2] = 2;
        assert!(bind_err(&p, &f).contains("query_weights expected shape (2, 16) or (2, 16, 1)"));
        let mut f = fixture(2, 2);
        f.lens.dtype = DType::I64;
        assert_eq!(bind_err(&p, &f), "bind: cache_lengths expected dtype int32, got int64");
        let mut f = fixture(2, 2);
        f.oi.device = Device::Cuda(1);
        assert_eq!(bind_err(&p, &f), "bind: output_indices expected device cuda:0, got cuda:1");
        let mut f = fixture(2, 2);
        f.pt.shape[1] = 0;
        f.pt.strides = TensorMeta::contiguous_strides(&f.pt.shape);
        assert!(bind_err(&p, &f).contains("page_table expected shape (2, >= 1)"));
    }

    #[test]
    fn zero_rows_bind_and_no_scores_gives_zero_pointer() {
        let p = plan(Mode::Decode, IndexSpace::Logical);
        let f = fixture(0, 3);
        let mut ops = f.ops();
        ops.output_scores = None;
        let b = bind(&p, &ops).unwrap();
        assert_eq!((b.rows(), b.args().out_scores), (0, 0));
    }
}
