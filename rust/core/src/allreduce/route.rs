//! Declaration routing (spec §5.2): which kernel serves a declared
//! all-reduce, or why none does (the live call then declines to NCCL).

use std::fmt;

use crate::collective::Operation;
use crate::tensor::{is_dense, is_row_major, DType, TensorMeta};

use super::geometry::FUSED_MAX_ROW_PACKS;
use super::layout::MAX_WORLD;
use super::limits::Limits;

/// Which kernel family serves a declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    OneShot,
    Fused,
    TwoShot,
}

impl Route {
    /// The name Python shows (`plan.route`, the adapter's route table).
    pub const fn name(self) -> &'static str {
        match self {
            Route::OneShot => "oneshot",
            Route::Fused => "oneshot_fused",
            Route::TwoShot => "twoshot",
        }
    }
}

/// A declared call as plain values. `strides` None means row-major contiguous.
#[derive(Debug, Clone, Copy)]
pub struct Declared<'a> {
    pub operation: Operation,
    pub shape: &'a [i64],
    pub dtype: DType,
    pub strides: Option<&'a [i64]>,
}

/// Why a declaration gets no route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decline(pub String);

impl fmt::Display for Decline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn decline(why: impl Into<String>) -> Decline {
    Decline(why.into())
}

/// Routes one declaration for a group of `world` ranks.
pub fn route(decl: &Declared<'_>, world: u32, limits: &Limits) -> Result<Route, Decline> {
    let Declared { operation, shape, dtype, strides } = *decl;
    if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32) {
        return Err(decline(format!("dtype {dtype} is not float16, bfloat16 or float32")));
    }
    if !(2..=MAX_WORLD).contains(&world) {
        return Err(decline(format!("world size {world} is outside 2..={MAX_WORLD}")));
    }
    if shape.len() > crate::tensor::MAX_RANK || shape.iter().any(|&d| d <= 0) {
        return Err(decline(format!("shape {shape:?} is not a positive shape of rank <= 8")));
    }
    let contiguous = TensorMeta::contiguous_strides(shape);
    let strides = strides.unwrap_or(&contiguous);
    if strides.len() != shape.len() {
        return Err(decline(format!("strides {strides:?} do not match shape {shape:?}")));
    }
    let numel = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64));
    let nbytes = numel.and_then(|n| n.checked_mul(dtype.itemsize()));
    let (Some(numel), Some(nbytes)) = (numel, nbytes) else {
        return Err(decline(format!("shape {shape:?} overflows 64-bit bytes")));
    };
    match operation {
        Operation::AllReduce => route_plain(shape, dtype, strides, numel, nbytes, world, limits),
        Operation::AllReduceFusedAddRmsNorm => route_fused(shape, dtype, strides, nbytes, limits),
    }
}

fn route_plain(
    shape: &[i64],
    dtype: DType,
    strides: &[i64],
    numel: u64,
    nbytes: u64,
    world: u32,
    limits: &Limits,
) -> Result<Route, Decline> {
    if nbytes <= limits.oneshot_max() {
        if nbytes % 16 != 0 {
            return Err(decline(format!("{nbytes} bytes is not a multiple of 16")));
        }
        if !is_dense(shape, strides) {
            return Err(decline(format!("strides {strides:?} of {shape:?} are not dense")));
        }
        return Ok(Route::OneShot);
    }
    if limits.twoshot_max() == 0 || nbytes > limits.twoshot_max() {
        return Err(decline(format!(
            "{nbytes} bytes is above the one-shot limit {} and outside the two-shot window \
             (limit {})",
            limits.oneshot_max(),
            limits.twoshot_max()
        )));
    }
    if dtype != DType::BF16 {
        return Err(decline(format!("two-shot is bfloat16 only, got {dtype}")));
    }
    if !is_row_major(shape, strides) {
        return Err(decline(format!("two-shot needs contiguous strides, got {strides:?}")));
    }
    let unit = (world as u64).saturating_mul(limits.twoshot_row_elems().max(1));
    if numel % unit != 0 || numel % 8 != 0 {
        return Err(decline(format!(
            "two-shot needs numel % (world * row_elems) == 0, got {numel} % {unit}"
        )));
    }
    Ok(Route::TwoShot)
}

fn route_fused(
    shape: &[i64],
    dtype: DType,
    strides: &[i64],
    nbytes: u64,
    limits: &Limits,
) -> Result<Route, Decline> {
    if nbytes > limits.fused_max() {
        return Err(decline(format!(
            "{nbytes} bytes is above the fused limit {}",
            limits.fused_max()
        )));
    }
    let Some(&hidden) = shape.last() else {
        return Err(decline("fused needs at least one dimension"));
    };
    let row_bytes = hidden as u64 * dtype.itemsize();
    if row_bytes % 16 != 0 || row_bytes / 16 > FUSED_MAX_ROW_PACKS as u64 {
        return Err(decline(format!(
            "fused needs hidden * itemsize a multiple of 16 and at most {} bytes, got {row_bytes}",
            FUSED_MAX_ROW_PACKS * 16
        )));
    }
    if !is_row_major(shape, strides) {
        return Err(decline(format!("fused needs contiguous rows, got strides {strides:?}")));
    }
    Ok(Route::Fused)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: Operation = Operation::AllReduce;
    const FUSED: Operation = Operation::AllReduceFusedAddRmsNorm;

    fn limits(oneshot: u64, fused: u64, twoshot: u64) -> Limits {
        Limits::new(oneshot, fused, twoshot, 4096).unwrap()
    }

    fn lim() -> Limits {
        limits(16 << 10, 72 << 10, 768 << 10)
    }

    fn r(
        operation: Operation,
        shape: &[i64],
        dtype: DType,
        strides: Option<&[i64]>,
        world: u32,
        limits: &Limits,
    ) -> Result<Route, Decline> {
        route(&Declared { operation, shape, dtype, strides }, world, limits)
    }

    fn plain(shape: &[i64], dtype: DType, world: u32) -> Result<Route, Decline> {
        r(PLAIN, shape, dtype, None, world, &lim())
    }

    #[test]
    fn oneshot_up_to_its_inclusive_ceiling() {
        assert_eq!(plain(&[1, 8192], DType::BF16, 2), Ok(Route::OneShot)); // 16 KiB
        assert_eq!(plain(&[4], DType::F32, 2), Ok(Route::OneShot));
        assert!(plain(&[3], DType::F32, 2).unwrap_err().0.contains("multiple of 16"));
        assert!(plain(&[4], DType::I32, 2).is_err());
    }

    #[test]
    fn twoshot_window_matches_the_reference_tp4_cases() {
        // TP4, row 4096: (12, 5120) declines, (16, 5120) is two-shot.
        assert!(plain(&[12, 5120], DType::BF16, 4).is_err());
        assert_eq!(plain(&[16, 5120], DType::BF16, 4), Ok(Route::TwoShot));
        // (64, 4096) bf16 = 512 KiB at TP4: two-shot.
        assert_eq!(plain(&[64, 4096], DType::BF16, 4), Ok(Route::TwoShot));
        // above the window, or not bf16: decline
        assert!(plain(&[128, 4096], DType::BF16, 4).is_err());
        assert!(plain(&[16, 5120], DType::F16, 4).unwrap_err().0.contains("bfloat16"));
        // two-shot off
        let off = limits(16 << 10, 72 << 10, 0);
        assert!(r(PLAIN, &[16, 5120], DType::BF16, None, 4, &off).is_err());
    }

    #[test]
    fn fused_has_an_independent_ceiling() {
        let l = limits(16, 64, 768 << 10);
        let fused = r(FUSED, &[2, 4], DType::F32, None, 2, &l);
        assert_eq!(fused, Ok(Route::Fused));
        assert!(r(PLAIN, &[2, 4], DType::F32, None, 2, &l).is_err());
        // (4, 6144) bf16 = 48 KiB: fused under 72 KiB; plain, above 16 KiB with
        // two-shot off (the reference TP2 case), declines to NCCL
        let tp2 = limits(16 << 10, 72 << 10, 0);
        assert_eq!(r(FUSED, &[4, 6144], DType::BF16, None, 2, &tp2), fused);
        assert!(r(PLAIN, &[4, 6144], DType::BF16, None, 2, &tp2).is_err());
        // rows of 7 bf16 are not 16-byte packs
        assert!(r(FUSED, &[2, 7], DType::BF16, None, 2, &lim()).is_err());
        assert!(r(FUSED, &[], DType::BF16, None, 2, &lim()).is_err());
    }

    #[test]
    fn strides_and_singletons() {
        let l = lim();
        let s = |shape: &[i64], strides: &[i64]| r(PLAIN, shape, DType::BF16, Some(strides), 2, &l);
        assert_eq!(s(&[1, 8], &[10, 1]), Ok(Route::OneShot)); // padded singleton row
        assert!(s(&[2, 8], &[10, 1]).is_err()); // padded rows: not dense
        assert_eq!(s(&[8, 2], &[1, 8]), Ok(Route::OneShot)); // transposed but dense
        assert!(s(&[2, 8], &[8]).is_err());
        let f = r(FUSED, &[8, 2], DType::F32, Some(&[1, 8]), 2, &l);
        assert!(f.is_err(), "fused rows must be row-major");
    }

    #[test]
    fn world_sizes_two_to_eight() {
        for w in 2..=8 {
            assert_eq!(plain(&[8], DType::BF16, w), Ok(Route::OneShot));
        }
        assert!(plain(&[8], DType::BF16, 1).is_err());
        assert!(plain(&[8], DType::BF16, 9).is_err());
    }

    #[test]
    fn row_major_ignores_singletons() {
        assert!(is_row_major(&[1, 8], &[999, 1]));
        assert!(is_row_major(&[4, 1, 8], &[8, 3, 1]));
        assert!(!is_row_major(&[2, 8], &[16, 1]));
    }
}
