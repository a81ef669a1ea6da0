//! The scratch layout: named, typed regions of one caller-owned uint8 buffer.
//!
//! Every region starts on a [`REGION_ALIGN`]-byte boundary (relative to the
//! scratch base, which bind requires to be 16-byte aligned). Adding a region
//! is one [`RegionId`] variant plus one row of [`REGIONS`]; sizes depend only
//! on the plan's capacities, never on live values.

use arrayvec::ArrayVec;

use super::{SELECT_CANDIDATES, SELECT_STATE_WORDS};
use crate::error::{Error, Result};
use crate::tensor::DType;

/// Region starts are aligned to this many bytes.
pub const REGION_ALIGN: u64 = 1024;

/// Shape of a region, outermost first (rank <= 4).
pub type RegionShape = ArrayVec<u64, 4>;

/// The regions, in layout order. `RegionId as usize` indexes [`REGIONS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegionId {
    /// f32 [rows, supertile]: one chunk of scores per query row.
    Logits,
    /// f32 [2, rows, topk]: top-k values carried across chunks (ping-pong).
    CarryValues,
    /// i32 [2, rows, topk]: top-k indices carried across chunks (ping-pong).
    CarryIndices,
    /// f32 [rows, topk_slices, topk]: per-slice top-k values of the
    /// two-stage top-k (empty when topk_slices == 1).
    PartialValues,
    /// i32 [rows, topk_slices, topk]: their logical indices.
    PartialIndices,
    /// i64 [rows, SELECT_CANDIDATES]: the grid selection's candidates, in
    /// plans that hold its row state (empty otherwise).
    SelectCandidates,
    /// i32 [rows, words]: kernel-private per-row state; plans that may run
    /// the grid selection hold its `SELECT_STATE_WORDS` (`Plan::
    /// grid_select_state`), others 16 words.
    RowState,
}

impl RegionId {
    pub const COUNT: usize = REGIONS.len();
    pub const ALL: [RegionId; 7] = [
        RegionId::Logits,
        RegionId::CarryValues,
        RegionId::CarryIndices,
        RegionId::PartialValues,
        RegionId::PartialIndices,
        RegionId::SelectCandidates,
        RegionId::RowState,
    ];
}

/// What region shapes may depend on: the plan's static capacities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutInput {
    pub rows: u64,
    pub topk: u64,
    pub supertile: u64,
    pub width: u64,
    pub heads_padded: u64,
    pub max_chunks: u64,
    pub multiprocessors: u64,
    /// Slices of the two-stage top-k (1 = one CTA per row, no partials).
    pub topk_slices: u64,
    /// Whether the row state holds the grid selection's.
    pub grid_select_state: bool,
}

pub struct RegionSpec {
    pub id: RegionId,
    pub name: &'static str,
    pub dtype: DType,
    pub shape: fn(&LayoutInput) -> RegionShape,
}

fn dims<const N: usize>(d: [u64; N]) -> RegionShape {
    d.into_iter().collect()
}

fn row_state_words(g: &LayoutInput) -> u64 {
    if g.grid_select_state {
        SELECT_STATE_WORDS
    } else {
        16
    }
}

/// The region table. Order is layout order.
fn partial_shape(g: &LayoutInput) -> RegionShape {
    if g.topk_slices > 1 {
        dims([g.rows, g.topk_slices, g.topk])
    } else {
        dims([0])
    }
}

pub const REGIONS: [RegionSpec; 7] = [
    RegionSpec {
        id: RegionId::Logits,
        name: "logits",
        dtype: DType::F32,
        shape: |g| dims([g.rows, g.supertile]),
    },
    RegionSpec {
        id: RegionId::CarryValues,
        name: "carry_values",
        dtype: DType::F32,
        shape: |g| dims([2, g.rows, g.topk]),
    },
    RegionSpec {
        id: RegionId::CarryIndices,
        name: "carry_indices",
        dtype: DType::I32,
        shape: |g| dims([2, g.rows, g.topk]),
    },
    RegionSpec {
        id: RegionId::PartialValues,
        name: "partial_values",
        dtype: DType::F32,
        shape: partial_shape,
    },
    RegionSpec {
        id: RegionId::PartialIndices,
        name: "partial_indices",
        dtype: DType::I32,
        shape: partial_shape,
    },
    RegionSpec {
        id: RegionId::SelectCandidates,
        name: "select_candidates",
        dtype: DType::I64,
        shape: |g| if g.grid_select_state { dims([g.rows, SELECT_CANDIDATES]) } else { dims([0]) },
    },
    RegionSpec {
        id: RegionId::RowState,
        name: "row_state",
        dtype: DType::I32,
        shape: |g| dims([g.rows, row_state_words(g)]),
    },
];

/// One typed view of the scratch: `offset` bytes from the scratch base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    pub id: RegionId,
    pub name: &'static str,
    pub offset: u64,
    pub dtype: DType,
    pub shape: RegionShape,
    pub nbytes: u64,
}

impl Region {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScratchLayout {
    regions: ArrayVec<Region, { RegionId::COUNT }>,
    nbytes: u64,
}

fn overflow(what: &str) -> Error {
    Error::InvalidValue {
        op: "plan",
        operand: "scratch layout".into(),
        expected: "a size below 2^64 bytes".into(),
        got: format!("an overflow in {what}"),
    }
}

impl ScratchLayout {
    pub fn new(g: &LayoutInput) -> Result<ScratchLayout> {
        Self::build(&REGIONS, g)
    }

    fn build(specs: &[RegionSpec], g: &LayoutInput) -> Result<ScratchLayout> {
        let mut regions = ArrayVec::new();
        let mut cursor = 0u64;
        for spec in specs {
            let shape = (spec.shape)(g);
            let nbytes = shape
                .iter()
                .try_fold(spec.dtype.itemsize(), |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| overflow(spec.name))?;
            let offset =
                cursor.checked_next_multiple_of(REGION_ALIGN).ok_or_else(|| overflow(spec.name))?;
            cursor = offset.checked_add(nbytes).ok_or_else(|| overflow(spec.name))?;
            regions.push(Region {
                id: spec.id,
                name: spec.name,
                offset,
                dtype: spec.dtype,
                shape,
                nbytes,
            });
        }
        Ok(ScratchLayout { regions, nbytes: cursor.max(REGION_ALIGN) })
    }

    /// Total bytes the scratch must hold: max(end of the last region, 1024).
    #[inline]
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }

    #[inline]
    pub fn region(&self, id: RegionId) -> &Region {
        &self.regions[id as usize]
    }

    pub fn by_name(&self, name: &str) -> Option<&Region> {
        self.regions.iter().find(|r| r.name == name)
    }

    pub fn regions(&self) -> &[Region] {
        &self.regions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(rows: u64, topk: u64, supertile: u64) -> LayoutInput {
        LayoutInput {
            rows,
            topk,
            supertile,
            width: 16,
            heads_padded: 64,
            max_chunks: 2,
            multiprocessors: 1,
            topk_slices: 1,
            grid_select_state: false,
        }
    }

    #[test]
    fn table_is_indexed_by_region_id() {
        for (i, spec) in REGIONS.iter().enumerate() {
            assert_eq!(spec.id as usize, i, "{}", spec.name);
            assert_eq!(RegionId::ALL[i], spec.id);
        }
    }

    #[test]
    fn regions_are_aligned_disjoint_and_in_order() {
        let l = ScratchLayout::new(&input(3, 512, 512)).unwrap();
        let mut end = 0;
        for r in l.regions() {
            assert_eq!(r.offset % REGION_ALIGN, 0);
            assert!(r.offset >= end);
            assert_eq!(r.nbytes, r.numel() * r.dtype.itemsize());
            end = r.offset + r.nbytes;
        }
        assert_eq!(l.nbytes(), end);
        // logits 3*512*4 = 6144; carry 2*3*512*4 = 12288 each; no partials
        // (one slice); row_state 3*16*4
        let offsets: Vec<u64> = l.regions().iter().map(|r| r.offset).collect();
        let carry_end = 6144 + 2 * 12288;
        assert_eq!(offsets, [0, 6144, 6144 + 12288, carry_end, carry_end, carry_end, carry_end]);
        assert_eq!(l.nbytes(), 6144 + 2 * 12288 + 192);
        assert_eq!(l.region(RegionId::RowState).shape.as_slice(), &[3, 16]);
        assert_eq!(l.by_name("carry_indices").unwrap().dtype, DType::I32);
        assert!(l.by_name("nope").is_none());
    }

    #[test]
    fn two_stage_top_k_gets_partial_regions() {
        let l = ScratchLayout::new(&LayoutInput { topk_slices: 4, ..input(2, 512, 8192) }).unwrap();
        assert_eq!(l.region(RegionId::PartialValues).shape.as_slice(), &[2, 4, 512]);
        assert_eq!(l.region(RegionId::PartialIndices).dtype, DType::I32);
        assert_eq!(l.region(RegionId::PartialIndices).nbytes, 2 * 4 * 512 * 4);
    }

    #[test]
    fn offsets_round_up_to_the_alignment() {
        // the real regions are whole KiB multiples, so check rounding on odd sizes
        let specs = [
            RegionSpec { id: RegionId::Logits, name: "a", dtype: DType::U8, shape: |_| dims([3]) },
            RegionSpec {
                id: RegionId::RowState,
                name: "b",
                dtype: DType::I32,
                shape: |g| dims([g.rows, 257]),
            },
            RegionSpec {
                id: RegionId::CarryValues,
                name: "c",
                dtype: DType::F32,
                shape: |_| dims([0]),
            },
            RegionSpec {
                id: RegionId::CarryIndices,
                name: "d",
                dtype: DType::U8,
                shape: |_| dims([1]),
            },
        ];
        let l = ScratchLayout::build(&specs, &input(1, 512, 512)).unwrap();
        let offsets: Vec<u64> = l.regions().iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [0, 1024, 3072, 3072]);
        assert_eq!(l.nbytes(), 3073);
        let tiny = [RegionSpec {
            id: RegionId::Logits,
            name: "a",
            dtype: DType::U8,
            shape: |_| dims([3]),
        }];
        assert_eq!(ScratchLayout::build(&tiny, &input(1, 512, 512)).unwrap().nbytes(), 1024);
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        let g = LayoutInput { rows: u64::MAX / 2, ..input(1, 512, 512) };
        assert!(ScratchLayout::new(&g).unwrap_err().to_string().contains("overflow in logits"));
    }
}
