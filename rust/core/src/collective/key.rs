//! The exact key a declared plan is found by.
//!
//! `(operation, dtype, shape, address strides, norm)`: device, alignment,
//! channel and the plan's name are not part of it (spec §4.1). Keys live on
//! the stack (fixed-size, `Copy`), so building one for a lookup allocates
//! nothing.

use std::fmt;
use std::hash::{Hash, Hasher};

use super::{fmt_tuple, Operation};
use crate::tensor::{DType, Dims, MAX_RANK};

/// The norm part of a fused key: the identity of the declared weight object
/// (its address, Python's `id()`) and epsilon.
///
/// An identity can only be trusted while the object is alive; whoever builds
/// keys from identities must keep the objects alive as long as the keys are
/// indexed (the Python index holds a strong reference to every weight).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Norm {
    pub weight: u64,
    pub epsilon_bits: u64,
}

impl Norm {
    pub fn new(weight: u64, epsilon: f64) -> Norm {
        Norm { weight, epsilon_bits: epsilon_bits(epsilon) }
    }

    pub fn epsilon(self) -> f64 {
        f64::from_bits(self.epsilon_bits)
    }
}

/// Bits of `epsilon` that compare the way Python's float `==` does for every
/// epsilon a declaration can hold: -0.0 and 0.0 share bits, and NaN is never
/// declared (so a NaN probe, unequal to everything, never matches either).
pub fn epsilon_bits(epsilon: f64) -> u64 {
    if epsilon == 0.0 {
        0
    } else {
        epsilon.to_bits()
    }
}

/// The strides that decide addresses: the stride of a size-1 dimension is
/// never multiplied by a non-zero index, so it is set to 0. A trimmed output
/// that keeps a padded row stride with one live row then matches the
/// contiguous declaration of its shape.
pub fn address_strides(shape: &[i64], strides: &[i64]) -> Dims {
    shape.iter().zip(strides).map(|(&d, &s)| if d == 1 { 0 } else { s }).collect()
}

/// Why a live tensor can never have a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unindexable {
    /// More than `MAX_RANK` dimensions, or strides of another rank than the
    /// shape: no declaration can have such a key, so this is a plain miss.
    Rank,
    /// A dimension of size 0. Declared extents are positive, so it could only
    /// miss; callers report it as bad input (an empty all-reduce is a caller bug).
    ZeroSize,
    /// A negative stride on a dimension of size > 1 (not a collective operand).
    NegativeStride,
}

impl Unindexable {
    /// What a lookup operand must be, for error messages.
    pub const fn expected(self) -> &'static str {
        match self {
            Unindexable::Rank => "at most 8 dimensions, with one stride per dimension",
            Unindexable::ZeroSize => "a tensor with at least one element",
            Unindexable::NegativeStride => "non-negative strides",
        }
    }
}

/// The key of a declaration or of a live tensor.
///
/// Fixed-size and `Copy`: dimensions sit in inline arrays (the unused tail
/// is zero), and equality and hashing read only the live dimensions, so a
/// key costs a few ns to build, hash and compare (`cargo bench -p b12x-core`).
// repr(C): what a comparison reads (head, norm, the first dims) shares the
// first cache line of the key.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct PlanKey {
    /// Operation, dtype and rank packed in one word (see `head`), so equality
    /// and hashing test them at once.
    head: u64,
    /// `None` for the plain all-reduce, the weight identity and epsilon for the fused one.
    norm: Option<Norm>,
    /// `[extent, address stride]` per dimension.
    dims: [[i64; 2]; MAX_RANK],
    operation: Operation,
    dtype: DType,
    rank: u8,
}

impl PartialEq for PlanKey {
    #[inline]
    fn eq(&self, other: &PlanKey) -> bool {
        // an explicit loop: slice equality would call memcmp for two or three dims
        self.head == other.head
            && self.norm == other.norm
            && (0..usize::from(self.rank).min(MAX_RANK)).all(|i| self.dims[i] == other.dims[i])
    }
}

impl Eq for PlanKey {}

/// Odd 64-bit constants for multiplicative mixing (digits of pi, as in many hashes).
const MIX: [u64; 4] =
    [0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7345, 0xa409_3822_299f_31d1, 0x082e_fa98_ec4e_6c89];

/// Operation, dtype and rank in one word; distinct triples give distinct words.
const fn head(operation: Operation, dtype: DType, rank: u8) -> u64 {
    (operation as u64) | dtype_code(dtype) << 8 | (rank as u64) << 40
}

/// A small stable code per dtype (injective).
const fn dtype_code(dtype: DType) -> u64 {
    match dtype {
        DType::F8E4M3 => 1,
        DType::F8E5M2 => 2,
        DType::BF16 => 3,
        DType::F16 => 4,
        DType::F32 => 5,
        DType::F64 => 6,
        DType::I8 => 7,
        DType::I16 => 8,
        DType::I32 => 9,
        DType::I64 => 10,
        DType::U8 => 11,
        DType::Bool => 12,
        DType::Other { code, bits } => 0x100 | (code as u64) << 16 | (bits as u64) << 24,
    }
}

impl PlanKey {
    /// The hash the index files this key under. The per-dimension multiplies
    /// are independent of each other (only a rotate-xor chain links them), and
    /// one folded 128-bit multiply spreads the result over all 64 bits, which
    /// the table's bucket index (low bits) and tag (high bits) both read.
    #[inline]
    pub fn hash64(&self) -> u64 {
        let mut acc = self.head;
        for i in 0..usize::from(self.rank).min(MAX_RANK) {
            acc = acc.rotate_left(23)
                ^ (self.dims[i][0] as u64).wrapping_mul(MIX[0])
                ^ (self.dims[i][1] as u64).wrapping_mul(MIX[1]);
        }
        if let Some(norm) = self.norm {
            acc = acc.rotate_left(23)
                ^ norm.weight.wrapping_mul(MIX[2])
                ^ norm.epsilon_bits.wrapping_mul(MIX[3]);
        }
        let wide = u128::from(acc ^ MIX[3]) * u128::from(MIX[0]);
        (wide as u64) ^ ((wide >> 64) as u64)
    }
}

impl Hash for PlanKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash64());
    }
}

impl PlanKey {
    /// The key of a tensor (or declaration) with these properties. `norm` is
    /// dropped for the plain operation, as the reference does.
    #[inline(always)]
    pub fn new(
        operation: Operation,
        dtype: DType,
        shape: &[i64],
        strides: &[i64],
        norm: Option<Norm>,
    ) -> Result<PlanKey, Unindexable> {
        let rank = shape.len();
        if rank > MAX_RANK || strides.len() != rank {
            return Err(Unindexable::Rank);
        }
        let mut key = PlanKey {
            head: head(operation, dtype, rank as u8),
            operation,
            dtype,
            rank: rank as u8,
            norm: if operation.is_fused() { norm } else { None },
            dims: [[0; 2]; MAX_RANK],
        };
        let (mut zero, mut negative) = (false, false);
        for i in 0..rank {
            let (d, s) = (shape[i], strides[i]);
            zero |= d == 0;
            negative |= d != 1 && s < 0;
            key.dims[i] = [d, if d == 1 { 0 } else { s }];
        }
        if zero {
            Err(Unindexable::ZeroSize)
        } else if negative {
            Err(Unindexable::NegativeStride)
        } else {
            Ok(key)
        }
    }

    /// The same key with `norm` (kept only for the fused operation).
    #[inline]
    pub fn with_norm(mut self, norm: Option<Norm>) -> PlanKey {
        self.norm = if self.operation.is_fused() { norm } else { None };
        self
    }

    pub fn operation(&self) -> Operation {
        self.operation
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn rank(&self) -> usize {
        usize::from(self.rank)
    }

    pub fn shape(&self) -> Dims {
        self.dims[..self.rank()].iter().map(|d| d[0]).collect()
    }

    pub fn address_strides(&self) -> Dims {
        self.dims[..self.rank()].iter().map(|d| d[1]).collect()
    }

    pub fn norm(&self) -> Option<Norm> {
        self.norm
    }
}

impl fmt::Display for PlanKey {
    /// `all_reduce(2, 4) bfloat16 strides (4, 1)`, plus the norm when fused.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{} {} strides {}",
            self.operation,
            fmt_tuple(&self.shape()),
            self.dtype,
            fmt_tuple(&self.address_strides())
        )?;
        if let Some(norm) = self.norm {
            write!(f, " norm weight id {:#x} epsilon {:?}", norm.weight, norm.epsilon())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(shape: &[i64], strides: &[i64]) -> PlanKey {
        PlanKey::new(Operation::AllReduce, DType::BF16, shape, strides, None).unwrap()
    }

    #[test]
    fn size_one_strides_do_not_matter() {
        assert_eq!(address_strides(&[1, 8], &[10, 1]).as_slice(), &[0, 1]);
        assert_eq!(address_strides(&[8, 1], &[1, 77]).as_slice(), &[1, 0]);
        assert_eq!(key(&[1, 8], &[10, 1]), key(&[1, 8], &[8, 1]));
        assert_ne!(key(&[2, 8], &[10, 1]), key(&[2, 8], &[8, 1]));
        assert_ne!(key(&[1, 8], &[8, 2]), key(&[1, 8], &[8, 1]));
    }

    #[test]
    fn every_component_is_part_of_the_key() {
        let base = key(&[2, 4], &[4, 1]);
        assert_ne!(base, key(&[4, 2], &[2, 1]));
        assert_ne!(base, key(&[8], &[1]));
        let f32 = PlanKey::new(Operation::AllReduce, DType::F32, &[2, 4], &[4, 1], None).unwrap();
        assert_ne!(base, f32);
        let fused = |w, e| {
            PlanKey::new(
                Operation::AllReduceFusedAddRmsNorm,
                DType::BF16,
                &[2, 4],
                &[4, 1],
                Some(Norm::new(w, e)),
            )
            .unwrap()
        };
        assert_ne!(base, fused(1, 1e-6));
        assert_eq!(fused(1, 1e-6), fused(1, 1e-6));
        assert_ne!(fused(1, 1e-6), fused(2, 1e-6));
        assert_ne!(fused(1, 1e-6), fused(1, 1e-5));
        assert_eq!(fused(1, 0.0), fused(1, -0.0));
    }

    #[test]
    fn plain_keys_drop_the_norm() {
        let with =
            PlanKey::new(Operation::AllReduce, DType::F16, &[3], &[1], Some(Norm::new(7, 1e-6)))
                .unwrap();
        assert_eq!(with.norm(), None);
        assert_eq!(with.with_norm(Some(Norm::new(7, 1e-6))).norm(), None);
        let fused = PlanKey::new(Operation::AllReduceFusedAddRmsNorm, DType::F16, &[3], &[1], None)
            .unwrap();
        assert_eq!(fused.with_norm(Some(Norm::new(7, 1e-6))).norm(), Some(Norm::new(7, 1e-6)));
    }

    #[test]
    fn unindexable_tensors_say_why() {
        let new = |shape: &[i64], strides: &[i64]| {
            PlanKey::new(Operation::AllReduce, DType::BF16, shape, strides, None)
        };
        assert_eq!(new(&[0, 16], &[16, 1]), Err(Unindexable::ZeroSize));
        assert_eq!(new(&[4, 16], &[-16, 1]), Err(Unindexable::NegativeStride));
        assert!(new(&[1, 16], &[-16, 1]).is_ok());
        assert_eq!(new(&[1; 9], &[1; 9]), Err(Unindexable::Rank));
        assert_eq!(new(&[2, 2], &[1]), Err(Unindexable::Rank));
        let e = crate::Error::UnsupportedTensor {
            op: "lookup".into(),
            operand: "tensor".into(),
            expected: Unindexable::ZeroSize.expected().into(),
            shape: vec![0, 16],
            strides: vec![16, 1],
        };
        assert_eq!(
            e.to_string(),
            "lookup: tensor expected a tensor with at least one element, got shape (0, 16) \
             strides (16, 1)"
        );
    }

    #[test]
    fn hashes_agree_with_equality_and_spread() {
        use std::collections::HashSet;
        let mut seen = HashSet::new();
        let mut buckets = HashSet::new();
        for rows in 1..=4096 {
            for cols in [1, 16, 4096] {
                let k = key(&[rows, cols], &[cols, 1]);
                assert_eq!(k.hash64(), key(&[rows, cols], &[cols, 1]).hash64());
                assert!(seen.insert(k.hash64()), "collision at ({rows}, {cols})");
                buckets.insert(k.hash64() & 0xfff);
            }
        }
        // 12288 keys over 4096 low-bit buckets: a random function fills ~95% (3892)
        assert!(buckets.len() > 3700, "{} buckets", buckets.len());
        // size-1 strides do not reach the hash either
        assert_eq!(key(&[1, 8], &[10, 1]).hash64(), key(&[1, 8], &[8, 1]).hash64());
        // transposed dims hash differently
        assert_ne!(key(&[2, 3], &[1, 2]).hash64(), key(&[3, 2], &[2, 1]).hash64());
    }

    #[test]
    fn keys_print_for_error_messages() {
        assert_eq!(key(&[1, 8], &[10, 1]).to_string(), "all_reduce(1, 8) bfloat16 strides (0, 1)");
        let fused = PlanKey::new(
            Operation::AllReduceFusedAddRmsNorm,
            DType::F32,
            &[4],
            &[1],
            Some(Norm::new(0x10, 1e-6)),
        )
        .unwrap();
        assert_eq!(
            fused.to_string(),
            "all_reduce_fused_add_rms_norm(4,) float32 strides (1,) norm weight id 0x10 epsilon 1e-6"
        );
    }
}
