//! The one error type of b12x-core.
//!
//! Every variant names the operation and the operand it is about and carries
//! the expected and the actual value as data, so the Python layer can pick an
//! exception class from the variant and the message stays precise.

use std::borrow::Cow;

use crate::tensor::{DType, Device};

/// Operand or field names: mostly static, sometimes built (e.g. "scratch[0]").
pub type Name = Cow<'static, str>;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{op}: {operand} expected dtype {}, got {got}", fmt_dtypes(expected))]
    DType { op: &'static str, operand: Name, expected: Vec<DType>, got: DType },

    #[error("{op}: {operand} expected device {expected}, got {got}")]
    Device { op: &'static str, operand: Name, expected: Device, got: Device },

    #[error("{op}: {operand} expected rank {expected}, got rank {got} (shape {shape:?})")]
    Rank { op: &'static str, operand: Name, expected: String, got: usize, shape: Vec<i64> },

    #[error("{op}: {operand} expected shape {expected}, got {got:?}")]
    Shape { op: &'static str, operand: Name, expected: String, got: Vec<i64> },

    #[error(
        "{op}: {operand} expected {expected} strides, got strides {strides:?} for shape {shape:?}"
    )]
    Layout {
        op: &'static str,
        operand: Name,
        expected: Cow<'static, str>,
        shape: Vec<i64>,
        strides: Vec<i64>,
    },

    #[error("{op}: {operand} expected {align}-byte alignment, got address {addr:#x} (address % {align} = {})", addr % align)]
    Alignment { op: &'static str, operand: Name, align: u64, addr: u64 },

    #[error("{op}: {operand} byte extent overflows 64 bits (shape {shape:?}, strides {strides:?}, {itemsize}-byte elements)")]
    ExtentOverflow {
        op: &'static str,
        operand: Name,
        shape: Vec<i64>,
        strides: Vec<i64>,
        itemsize: u64,
    },

    #[error("{op}: {operand} expected at most {limit}, got {got}{}", hint_suffix(hint))]
    Capacity { op: &'static str, operand: Name, limit: u64, got: u64, hint: Cow<'static, str> },

    /// The opposite bound of `Capacity`: a buffer smaller than the plan needs.
    #[error("{op}: {operand} expected at least {need} {unit}, got {got}{}", hint_suffix(hint))]
    Insufficient {
        op: &'static str,
        operand: Name,
        need: u64,
        got: u64,
        unit: &'static str,
        hint: Cow<'static, str>,
    },

    #[error("{op}: {operand} expected {expected}, got {got}")]
    InvalidValue { op: &'static str, operand: Name, expected: Cow<'static, str>, got: String },

    /// An argument of the wrong Python type that is no tensor problem (an
    /// operation given as a number, an epsilon as text, a pair as a list).
    #[error("{op}: {operand} expected {expected}, got {got}")]
    ArgumentType { op: Name, operand: Name, expected: Cow<'static, str>, got: String },

    /// A tensor that can never be this operand (zero-size, negative strides).
    #[error(
        "{op}: {operand} expected {expected}, got shape {} strides {}",
        crate::collective::fmt_tuple(shape),
        crate::collective::fmt_tuple(strides)
    )]
    UnsupportedTensor {
        op: Name,
        operand: Name,
        expected: Cow<'static, str>,
        shape: Vec<i64>,
        strides: Vec<i64>,
    },

    /// An argument that names no device the operation can use: malformed,
    /// an ordinal out of range or not visible, or the wrong kind.
    #[error("{op}: {operand} expected {expected}, got {got}")]
    DeviceArgument { op: Name, operand: Name, expected: Cow<'static, str>, got: String },

    #[error(
        "{op}: {operand} expected a tensor (torch.Tensor or a __dlpack__ producer), got {got}"
    )]
    NotATensor { op: &'static str, operand: Name, got: String },

    /// A producer whose metadata cannot be read: a raising or lying
    /// `__dlpack__` / `data_ptr()`, a malformed DLPack capsule.
    #[error("{op}: {operand} expected a tensor with readable metadata, got {got}: {problem}")]
    BadTensor { op: &'static str, operand: Name, got: String, problem: String },

    /// A tensor producer an op cannot keep or run with (only torch tensors).
    #[error(
        "{op}: {operand} expected a torch.Tensor, got {got}; {op} keeps the tensor objects and \
         the work runs on torch's current stream or in the PyTorch reference, so convert it \
         first with torch.from_dlpack (no copy)"
    )]
    ForeignTensor { op: &'static str, operand: Name, got: String },

    /// Memory an op writes overlaps memory it reads or also writes.
    #[error(
        "{op}: {operand} expected memory disjoint from {other}, got bytes [{:#x}, {:#x}) \
         overlapping {other}'s bytes [{:#x}, {:#x})",
        range.0, range.1, other_range.0, other_range.1
    )]
    Overlap {
        op: &'static str,
        operand: Name,
        other: Name,
        range: (u64, u64),
        other_range: (u64, u64),
    },

    #[error("{0}")]
    UndeclaredPlan(String),

    /// A page id past the K cache that a run met (read back by a check).
    #[error("{0}")]
    PageTable(crate::indexer::PageFault),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn fmt_dtypes(dtypes: &[DType]) -> String {
    match dtypes {
        [one] => one.to_string(),
        many => {
            let names: Vec<String> = many.iter().map(ToString::to_string).collect();
            format!("one of {{{}}}", names.join(", "))
        }
    }
}

fn hint_suffix(hint: &str) -> String {
    if hint.is_empty() {
        String::new()
    } else {
        format!("; {hint}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_operand_expected_and_actual() {
        let e = Error::DType {
            op: "bind",
            operand: "q_fp8".into(),
            expected: vec![DType::F8E4M3],
            got: DType::BF16,
        };
        assert_eq!(e.to_string(), "bind: q_fp8 expected dtype float8_e4m3fn, got bfloat16");

        let e = Error::DType {
            op: "bind",
            operand: "query_weights".into(),
            expected: vec![DType::F32, DType::BF16],
            got: DType::I32,
        };
        assert!(e.to_string().contains("one of {float32, bfloat16}, got int32"));

        let e = Error::Overlap {
            op: "bind",
            operand: "scratch".into(),
            other: "index_k_cache".into(),
            range: (0x1000, 0x2000),
            other_range: (0x1800, 0x1900),
        };
        assert_eq!(
            e.to_string(),
            "bind: scratch expected memory disjoint from index_k_cache, got bytes [0x1000, \
             0x2000) overlapping index_k_cache's bytes [0x1800, 0x1900)"
        );

        let e = Error::Alignment { op: "bind", operand: "scratch".into(), align: 16, addr: 0x1004 };
        assert_eq!(
            e.to_string(),
            "bind: scratch expected 16-byte alignment, got address 0x1004 (address % 16 = 4)"
        );
    }
}
