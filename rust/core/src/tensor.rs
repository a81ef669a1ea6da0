//! Tensor metadata as plain values: what b12x needs to know about a tensor
//! to validate it and to hand its address to a kernel.

use std::fmt;

use arrayvec::ArrayVec;

/// Highest rank b12x accepts; every operand of every op is rank <= 4, so 8
/// leaves room while keeping `TensorMeta` free of heap allocation.
pub const MAX_RANK: usize = 8;

/// Shape or strides, stored inline.
pub type Dims = ArrayVec<i64, MAX_RANK>;

/// Element types b12x can name. Only some are accepted by any one op; the
/// others exist so that an error can say what it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    F8E4M3,
    F8E5M2,
    BF16,
    F16,
    F32,
    F64,
    I8,
    I16,
    I32,
    I64,
    U8,
    Bool,
    /// Anything else, by DLPack (code, bits); [`DType::UNKNOWN`] when the
    /// producer named a type with no DLPack code b12x knows.
    Other {
        code: u8,
        bits: u8,
    },
}

/// DLPack type codes (dlpack.h v1.1 `DLDataTypeCode`) and the names b12x
/// prints for them; fp8/fp6/fp4 codes name one format each.
const DLPACK_CODE_NAMES: [&str; 18] = [
    "int",
    "uint",
    "float",
    "opaque_handle",
    "bfloat",
    "complex",
    "bool",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3b11fnuz",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
];
/// First DLPack code whose name already says its width (the narrow floats).
const DLPACK_FIRST_NAMED_FORMAT: u8 = 7;

impl DType {
    /// A type b12x cannot name at all (no DLPack code known for it).
    pub const UNKNOWN: DType = DType::Other { code: 255, bits: 0 };

    pub const fn itemsize(self) -> u64 {
        match self {
            DType::F8E4M3 | DType::F8E5M2 | DType::I8 | DType::U8 | DType::Bool => 1,
            DType::BF16 | DType::F16 | DType::I16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::Other { bits, .. } => (bits as u64).div_ceil(8),
        }
    }

    /// The name torch uses (`torch.<name>`), so messages read naturally to torch users.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F8E4M3 => "float8_e4m3fn",
            DType::F8E5M2 => "float8_e5m2",
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::Bool => "bool",
            DType::Other { .. } => "unsupported",
        }
    }

    /// Maps a DLPack data type (code, bits, lanes) to a dtype.
    /// Codes from dlpack.h v1.1: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool,
    /// 10 float8_e4m3fn, 12 float8_e5m2. Vector types (lanes != 1) and the
    /// sentinel code 255 are [`DType::UNKNOWN`].
    pub fn from_dlpack(code: u8, bits: u8, lanes: u16) -> DType {
        if lanes != 1 || code == 255 {
            return DType::UNKNOWN;
        }
        match (code, bits) {
            (0, 8) => DType::I8,
            (0, 16) => DType::I16,
            (0, 32) => DType::I32,
            (0, 64) => DType::I64,
            (1, 8) => DType::U8,
            (2, 16) => DType::F16,
            (2, 32) => DType::F32,
            (2, 64) => DType::F64,
            (4, 16) => DType::BF16,
            (6, 8) => DType::Bool,
            (10, 8) => DType::F8E4M3,
            (12, 8) => DType::F8E5M2,
            _ => DType::Other { code, bits },
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DType::UNKNOWN => f.write_str("a dtype b12x does not know"),
            // numpy-style names: int16 (code 0), complex64 (code 5), float8_e4m3fnuz ...
            DType::Other { code, bits } => match DLPACK_CODE_NAMES.get(code as usize) {
                Some(name) if code >= DLPACK_FIRST_NAMED_FORMAT => write!(f, "{name}"),
                Some(name) => write!(f, "{name}{bits}"),
                None => write!(f, "an unknown DLPack type (code {code}, {bits} bits)"),
            },
            other => f.write_str(other.name()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    Cuda(u32),
    /// torch's meta device: shapes without storage (fake tensors, tracing).
    Meta,
    /// A device b12x cannot use, by DLPack device type (-1: not known).
    Other(i32),
}

impl Device {
    pub const fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

/// Highest CUDA ordinal b12x accepts: torch keeps a device index in an int8
/// (`torch.device("cuda:300")` silently becomes cuda:44).
pub const MAX_CUDA_ORDINAL: u32 = i8::MAX as u32;

/// A device named by a string, in the one grammar every b12x entry point
/// reads: `"cpu"`, `"cuda"` (torch's current device) or `"cuda:N"` with N in
/// 0 ..= [`MAX_CUDA_ORDINAL`] (decimal digits only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceName {
    Cpu,
    /// `None`: the caller's current CUDA device.
    Cuda(Option<u32>),
}

impl DeviceName {
    /// What a device argument may be, for messages (the Python entry points
    /// add torch.device objects and ordinals to the strings [`parse`] reads).
    ///
    /// [`parse`]: DeviceName::parse
    pub const EXPECTED: &'static str = "a torch.device, 'cpu', 'cuda' (the current CUDA device), \
                                        'cuda:N' or a CUDA ordinal N";
    /// The same, where the operation needs a CUDA device.
    pub const EXPECTED_CUDA: &'static str = "a CUDA device: a torch.device, 'cuda' (the current \
                                             CUDA device), 'cuda:N' or a CUDA ordinal N";

    /// `text` as a device name, or None when it is none (or names an
    /// ordinal past [`MAX_CUDA_ORDINAL`]). Whitespace is not trimmed.
    pub fn parse(text: &str) -> Option<DeviceName> {
        match text {
            "cpu" => Some(DeviceName::Cpu),
            "cuda" => Some(DeviceName::Cuda(None)),
            _ => {
                let digits = text.strip_prefix("cuda:")?;
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                let ordinal = digits.parse::<u32>().ok()?;
                (ordinal <= MAX_CUDA_ORDINAL).then_some(DeviceName::Cuda(Some(ordinal)))
            }
        }
    }
}

/// `ordinal` as a CUDA ordinal: `0..=MAX_CUDA_ORDINAL` (torch's device index
/// is int8, so `torch.device("cuda:300")` would silently be cuda:44).
pub fn cuda_ordinal(op: &str, ordinal: i64) -> crate::Result<u32> {
    match u32::try_from(ordinal) {
        Ok(i) if i <= MAX_CUDA_ORDINAL => Ok(i),
        _ => Err(crate::Error::DeviceArgument {
            op: op.to_string().into(),
            operand: "device".into(),
            expected: format!(
                "a CUDA ordinal in [0, {MAX_CUDA_ORDINAL}] (torch's device index is int8)"
            )
            .into(),
            got: ordinal.to_string(),
        }),
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::Meta => f.write_str("meta"),
            Device::Other(-1) => f.write_str("a device that is neither cpu nor cuda"),
            Device::Other(t) => write!(f, "DLPack device type {t}"),
        }
    }
}

/// What b12x reads off a tensor. Strides are in elements, like torch's.
/// `data_ptr` is the address of element 0 (torch's `data_ptr()`);
/// `byte_offset` is kept separately only for producers (DLPack) that report
/// a base pointer plus offset, and `address()` combines the two.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMeta {
    pub dtype: DType,
    pub device: Device,
    pub shape: Dims,
    pub strides: Dims,
    pub data_ptr: u64,
    pub byte_offset: u64,
}

impl TensorMeta {
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Address of element 0, wrapping never: an overflow here means the
    /// producer handed over garbage, so it saturates and fails alignment checks.
    pub fn address(&self) -> u64 {
        self.data_ptr.saturating_add(self.byte_offset)
    }

    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d.max(0) as u64).product()
    }

    pub fn is_empty(&self) -> bool {
        self.shape.contains(&0)
    }

    /// Row-major contiguous strides for `shape`.
    pub fn contiguous_strides(shape: &[i64]) -> Dims {
        let mut strides = Dims::new();
        let mut acc = 1i64;
        for &d in shape.iter().rev() {
            strides.push(acc);
            acc = acc.saturating_mul(d.max(1));
        }
        strides.reverse();
        strides
    }

    /// torch's definition: the strides of every dimension of size > 1 equal
    /// the row-major ones (size-1 dimensions may carry any stride).
    pub fn is_contiguous(&self) -> bool {
        self.is_empty() || is_row_major(&self.shape, &self.strides)
    }

    /// Weak contiguity: the elements cover a dense block without overlap,
    /// in some order of dimensions (see [`is_dense`]); empty tensors qualify.
    pub fn is_weakly_contiguous(&self) -> bool {
        self.is_empty() || is_dense(&self.shape, &self.strides)
    }

    /// Number of bytes spanned from element 0 to one past the last element,
    /// checked in 64-bit; None on overflow or on a negative stride of a
    /// dimension with more than one element (size-1 dimensions never move an
    /// address, so their stride is ignored).
    pub fn byte_extent(&self) -> Option<u64> {
        if self.is_empty() {
            return Some(0);
        }
        let mut last: u64 = 0;
        for (&d, &s) in self.shape.iter().zip(&self.strides) {
            if d == 1 {
                continue;
            }
            let span = u64::try_from(d - 1).ok()?.checked_mul(u64::try_from(s).ok()?)?;
            last = last.checked_add(span)?;
        }
        last.checked_add(1)?.checked_mul(self.dtype.itemsize())
    }

    /// The bytes `[start, end)` the tensor spans, or None when the end does
    /// not fit 64 bits (see [`TensorMeta::byte_extent`]).
    pub fn byte_range(&self) -> Option<(u64, u64)> {
        let start = self.address();
        Some((start, start.checked_add(self.byte_extent()?)?))
    }

    /// True when some dimension of more than one element has a negative stride.
    pub fn has_negative_strides(&self) -> bool {
        self.shape.iter().zip(&self.strides).any(|(&d, &s)| d > 1 && s < 0)
    }
}

/// Row-major once size-1 dimensions are ignored (their stride never moves an
/// address): torch's contiguity for non-empty tensors.
pub fn is_row_major(shape: &[i64], strides: &[i64]) -> bool {
    let mut expected = 1i64;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(d);
    }
    true
}

/// Dense in some dimension order: ignoring size-1 dimensions, the others
/// sorted by stride pack densely from stride 1 (so no overlap, no gaps, no
/// negative strides). An elementwise op may treat such a tensor as flat.
pub fn is_dense(shape: &[i64], strides: &[i64]) -> bool {
    let mut live: ArrayVec<(i64, i64), MAX_RANK> = ArrayVec::new();
    for (&d, &s) in shape.iter().zip(strides) {
        if d != 1 && live.try_push((s, d)).is_err() {
            return false;
        }
    }
    live.sort_unstable();
    let mut expected = 1i64;
    for (s, d) in live {
        if s != expected {
            return false;
        }
        expected = expected.saturating_mul(d);
    }
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn device_names() {
        use super::DeviceName::{Cpu, Cuda};
        assert_eq!(DeviceName::parse("cpu"), Some(Cpu));
        assert_eq!(DeviceName::parse("cuda"), Some(Cuda(None)));
        assert_eq!(DeviceName::parse("cuda:0"), Some(Cuda(Some(0))));
        assert_eq!(DeviceName::parse("cuda:007"), Some(Cuda(Some(7))));
        assert_eq!(DeviceName::parse("cuda:127"), Some(Cuda(Some(MAX_CUDA_ORDINAL))));
        for bad in [
            "cuda:128",
            "cuda:300",
            "cuda:-1",
            "cuda:+1",
            "cuda:1.5",
            "cuda:",
            "gpu0",
            "",
            " cuda",
            "cuda:99999999999",
            "CPU",
        ] {
            assert_eq!(DeviceName::parse(bad), None, "{bad:?}");
        }
    }

    use super::*;

    fn meta(dtype: DType, shape: &[i64], strides: &[i64]) -> TensorMeta {
        TensorMeta {
            dtype,
            device: Device::Cpu,
            shape: shape.iter().copied().collect(),
            strides: strides.iter().copied().collect(),
            data_ptr: 0x1000,
            byte_offset: 0,
        }
    }

    #[test]
    fn contiguous_strides_are_row_major() {
        assert_eq!(TensorMeta::contiguous_strides(&[2, 3, 4]).as_slice(), &[12, 4, 1]);
        assert_eq!(TensorMeta::contiguous_strides(&[]).as_slice(), &[] as &[i64]);
    }

    #[test]
    fn contiguity_ignores_size_one_strides() {
        assert!(meta(DType::F32, &[2, 3], &[3, 1]).is_contiguous());
        assert!(meta(DType::F32, &[1, 3], &[99, 1]).is_contiguous());
        assert!(!meta(DType::F32, &[2, 3], &[1, 2]).is_contiguous());
        assert!(!meta(DType::F32, &[2, 3], &[4, 1]).is_contiguous());
    }

    #[test]
    fn weak_contiguity_accepts_permutations_only_when_dense() {
        assert!(meta(DType::F32, &[2, 3], &[1, 2]).is_weakly_contiguous());
        assert!(!meta(DType::F32, &[2, 3], &[4, 1]).is_weakly_contiguous());
        assert!(!meta(DType::F32, &[2, 3], &[3, -1]).is_weakly_contiguous());
        assert!(meta(DType::F32, &[1, 3], &[0, 1]).is_weakly_contiguous());
        assert!(!meta(DType::F32, &[3, 3], &[0, 1]).is_weakly_contiguous());
    }

    #[test]
    fn byte_extent_is_checked() {
        assert_eq!(meta(DType::BF16, &[2, 3], &[3, 1]).byte_extent(), Some(12));
        assert_eq!(meta(DType::U8, &[2, 8448], &[10000, 1]).byte_extent(), Some(18448));
        assert_eq!(meta(DType::U8, &[0, 8448], &[10000, 1]).byte_extent(), Some(0));
        assert_eq!(meta(DType::F32, &[i64::MAX, 2], &[2, 1]).byte_extent(), None);
        // page offsets past 2^31 stay exact in 64-bit
        let big = meta(DType::U8, &[300_000, 8448], &[8448, 1]);
        assert_eq!(big.byte_extent(), Some(300_000 * 8448));
    }

    #[test]
    fn size_one_dimensions_never_count_towards_the_extent() {
        assert_eq!(meta(DType::I32, &[1], &[-7]).byte_extent(), Some(4));
        assert_eq!(meta(DType::I32, &[1, 3], &[i64::MIN, 1]).byte_extent(), Some(12));
        assert!(!meta(DType::I32, &[1, 3], &[-1, 1]).has_negative_strides());
        assert!(meta(DType::I32, &[2, 3], &[-3, 1]).has_negative_strides());
        assert_eq!(meta(DType::I32, &[2, 3], &[-3, 1]).byte_extent(), None);
        assert_eq!(meta(DType::U8, &[4], &[1]).byte_range(), Some((0x1000, 0x1004)));
        let mut top = meta(DType::U8, &[4], &[1]);
        top.data_ptr = u64::MAX - 2;
        assert_eq!(top.byte_range(), None);
    }

    #[test]
    fn odd_dtypes_display_readably() {
        assert_eq!(DType::Other { code: 5, bits: 64 }.to_string(), "complex64");
        assert_eq!(DType::Other { code: 1, bits: 16 }.to_string(), "uint16");
        assert_eq!(DType::Other { code: 11, bits: 8 }.to_string(), "float8_e4m3fnuz");
        assert_eq!(DType::UNKNOWN.to_string(), "a dtype b12x does not know");
        assert_eq!(
            DType::Other { code: 99, bits: 8 }.to_string(),
            "an unknown DLPack type (code 99, 8 bits)"
        );
        assert_eq!(DType::from_dlpack(2, 16, 1).to_string(), "float16");
    }

    #[test]
    fn dlpack_codes_map_to_dtypes() {
        assert_eq!(DType::from_dlpack(10, 8, 1), DType::F8E4M3);
        assert_eq!(DType::from_dlpack(4, 16, 1), DType::BF16);
        assert_eq!(DType::from_dlpack(1, 8, 1), DType::U8);
        assert_eq!(DType::from_dlpack(2, 32, 4), DType::UNKNOWN);
        assert_eq!(DType::from_dlpack(5, 64, 1), DType::Other { code: 5, bits: 64 });
    }
}
