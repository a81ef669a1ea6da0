//! Operand checks with precise errors.
//!
//! `Operand` pairs a tensor's metadata with the op and operand names used in
//! messages; each check returns `Result<&Self>` so checks chain with `?`:
//!
//! ```
//! # use b12x_core::{validate::Operand, DType, Device, TensorMeta};
//! # let meta = TensorMeta { dtype: DType::I32, device: Device::Cpu,
//! #     shape: [4].into_iter().collect(), strides: [1].into_iter().collect(),
//! #     data_ptr: 0x100, byte_offset: 0 };
//! Operand::new("bind", "cache_lengths", &meta)
//!     .dtype(&[DType::I32])?
//!     .rank(1)?
//!     .contiguous()?;
//! # Ok::<(), b12x_core::Error>(())
//! ```

use std::borrow::Cow;

use crate::error::{Error, Name, Result};
use crate::tensor::{DType, Device, TensorMeta};

pub struct Operand<'a> {
    pub op: &'static str,
    pub name: Name,
    pub meta: &'a TensorMeta,
}

impl<'a> Operand<'a> {
    pub fn new(op: &'static str, name: impl Into<Name>, meta: &'a TensorMeta) -> Self {
        Operand { op, name: name.into(), meta }
    }

    fn shape_vec(&self) -> Vec<i64> {
        self.meta.shape.to_vec()
    }

    pub fn dtype(&self, allowed: &[DType]) -> Result<&Self> {
        if allowed.contains(&self.meta.dtype) {
            Ok(self)
        } else {
            Err(Error::DType {
                op: self.op,
                operand: self.name.clone(),
                expected: allowed.to_vec(),
                got: self.meta.dtype,
            })
        }
    }

    pub fn device(&self, expected: Device) -> Result<&Self> {
        if self.meta.device == expected {
            Ok(self)
        } else {
            Err(Error::Device {
                op: self.op,
                operand: self.name.clone(),
                expected,
                got: self.meta.device,
            })
        }
    }

    pub fn rank(&self, expected: usize) -> Result<&Self> {
        self.rank_in(expected, expected)
    }

    pub fn rank_in(&self, lo: usize, hi: usize) -> Result<&Self> {
        let got = self.meta.rank();
        if (lo..=hi).contains(&got) {
            return Ok(self);
        }
        let expected = if lo == hi { lo.to_string() } else { format!("{lo}..={hi}") };
        Err(Error::Rank {
            op: self.op,
            operand: self.name.clone(),
            expected,
            got,
            shape: self.shape_vec(),
        })
    }

    /// Exact shape; `None` entries match any extent (printed as `*`).
    pub fn shape(&self, expected: &[Option<i64>]) -> Result<&Self> {
        let ok = expected.len() == self.meta.rank()
            && expected.iter().zip(&self.meta.shape).all(|(e, &g)| e.is_none_or(|e| e == g));
        if ok {
            return Ok(self);
        }
        let parts: Vec<String> =
            expected.iter().map(|e| e.map_or_else(|| "*".to_string(), |v| v.to_string())).collect();
        Err(self.shape_error(format!("({})", parts.join(", "))))
    }

    /// A shape error with a free-form description of what was expected.
    pub fn shape_error(&self, expected: impl Into<String>) -> Error {
        Error::Shape {
            op: self.op,
            operand: self.name.clone(),
            expected: expected.into(),
            got: self.shape_vec(),
        }
    }

    pub fn layout_error(&self, expected: impl Into<Cow<'static, str>>) -> Error {
        Error::Layout {
            op: self.op,
            operand: self.name.clone(),
            expected: expected.into(),
            shape: self.shape_vec(),
            strides: self.meta.strides.to_vec(),
        }
    }

    pub fn contiguous(&self) -> Result<&Self> {
        if self.meta.is_contiguous() {
            Ok(self)
        } else {
            Err(self.layout_error("contiguous (row-major)"))
        }
    }

    pub fn weakly_contiguous(&self) -> Result<&Self> {
        if self.meta.is_weakly_contiguous() {
            Ok(self)
        } else {
            Err(self.layout_error("weakly contiguous (dense, non-overlapping, non-negative)"))
        }
    }

    /// Strides of dimensions with more than one element are >= 0 (a size-1
    /// dimension's stride never moves an address).
    pub fn non_negative_strides(&self) -> Result<&Self> {
        if !self.meta.has_negative_strides() {
            Ok(self)
        } else {
            Err(self.layout_error("non-negative"))
        }
    }

    pub fn aligned(&self, align: u64) -> Result<&Self> {
        let addr = self.meta.address();
        if addr % align == 0 {
            Ok(self)
        } else {
            Err(Error::Alignment { op: self.op, operand: self.name.clone(), align, addr })
        }
    }

    /// Bytes spanned by the operand, checked in 64-bit; also rejects
    /// negative strides, whose extent would run below the base address.
    pub fn byte_extent(&self) -> Result<u64> {
        self.non_negative_strides()?;
        self.meta.byte_extent().ok_or_else(|| self.overflow())
    }

    /// The bytes `[start, end)` the operand spans, checked in 64-bit.
    pub fn byte_range(&self) -> Result<(u64, u64)> {
        let extent = self.byte_extent()?;
        let start = self.meta.address();
        let end = start.checked_add(extent).ok_or_else(|| self.overflow())?;
        Ok((start, end))
    }

    fn overflow(&self) -> Error {
        Error::ExtentOverflow {
            op: self.op,
            operand: self.name.clone(),
            shape: self.shape_vec(),
            strides: self.meta.strides.to_vec(),
            itemsize: self.meta.dtype.itemsize(),
        }
    }

    /// A dimension's extent must not exceed `limit`.
    pub fn dim_at_most(&self, dim: usize, limit: u64, what: &'static str) -> Result<&Self> {
        let got = self.meta.shape[dim].max(0) as u64;
        if got <= limit {
            Ok(self)
        } else {
            Err(Error::Capacity {
                op: self.op,
                operand: format!("{}.shape[{dim}] ({what})", self.name).into(),
                limit,
                got,
                hint: Cow::Borrowed(""),
            })
        }
    }
}

/// Values an on/off environment switch accepts (case-insensitive, surrounding
/// blanks ignored); unset or empty means the switch's default.
pub const SWITCH_ON: [&str; 4] = ["1", "on", "true", "yes"];
pub const SWITCH_OFF: [&str; 4] = ["0", "off", "false", "no"];

/// Reads an on/off environment variable's value: `None` for an empty value
/// (keep the default), an error naming the variable and the accepted values
/// for anything else that is not in [`SWITCH_ON`] or [`SWITCH_OFF`].
pub fn parse_switch(variable: &'static str, value: &str) -> Result<Option<bool>> {
    let v = value.trim().to_ascii_lowercase();
    if v.is_empty() {
        Ok(None)
    } else if SWITCH_ON.contains(&v.as_str()) {
        Ok(Some(true))
    } else if SWITCH_OFF.contains(&v.as_str()) {
        Ok(Some(false))
    } else {
        Err(Error::InvalidValue {
            op: "environment",
            operand: variable.into(),
            expected: format!(
                "one of {} (on) or {} (off), or unset",
                SWITCH_ON.join("/"),
                SWITCH_OFF.join("/")
            )
            .into(),
            got: format!("{value:?}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(dtype: DType, shape: &[i64], strides: &[i64], ptr: u64) -> TensorMeta {
        TensorMeta {
            dtype,
            device: Device::Cuda(0),
            shape: shape.iter().copied().collect(),
            strides: strides.iter().copied().collect(),
            data_ptr: ptr,
            byte_offset: 0,
        }
    }

    #[test]
    fn each_check_passes_and_fails_with_its_error() {
        let m = meta(DType::BF16, &[4, 8], &[8, 1], 0x1000);
        let op = Operand::new("test", "x", &m);
        assert!(op.dtype(&[DType::BF16]).is_ok());
        assert!(matches!(op.dtype(&[DType::F32]), Err(Error::DType { got: DType::BF16, .. })));
        assert!(op.device(Device::Cuda(0)).is_ok());
        assert!(matches!(op.device(Device::Cuda(1)), Err(Error::Device { .. })));
        assert!(op.rank(2).is_ok());
        assert!(matches!(op.rank(3), Err(Error::Rank { got: 2, .. })));
        assert!(op.shape(&[Some(4), None]).is_ok());
        let err = op.shape(&[Some(4), Some(16)]).err().unwrap();
        assert_eq!(err.to_string(), "test: x expected shape (4, 16), got [4, 8]");
        assert!(op.contiguous().is_ok());
        assert!(op.aligned(16).is_ok());
        assert_eq!(op.byte_extent().unwrap(), 64);
    }

    #[test]
    fn misaligned_and_strided_and_overflowing_are_rejected() {
        let m = meta(DType::F32, &[4, 8], &[16, 1], 0x1004);
        let op = Operand::new("test", "y", &m);
        assert!(matches!(op.aligned(16), Err(Error::Alignment { addr: 0x1004, .. })));
        assert!(matches!(op.contiguous(), Err(Error::Layout { .. })));
        assert!(matches!(op.weakly_contiguous(), Err(Error::Layout { .. })));

        let neg = meta(DType::F32, &[4], &[-1], 0x1000);
        assert!(matches!(Operand::new("t", "n", &neg).byte_extent(), Err(Error::Layout { .. })));
        // a size-1 dimension's stride is never applied, whatever its sign
        let one = meta(DType::F32, &[1, 4], &[-1, 1], 0x1000);
        assert_eq!(Operand::new("t", "o", &one).byte_range().unwrap(), (0x1000, 0x1010));
        let top = meta(DType::F32, &[4], &[1], u64::MAX - 8);
        assert!(matches!(
            Operand::new("t", "top", &top).byte_range(),
            Err(Error::ExtentOverflow { .. })
        ));

        let huge = meta(DType::F32, &[1 << 40, 1 << 30], &[1 << 30, 1], 0x1000);
        assert!(matches!(
            Operand::new("t", "h", &huge).byte_extent(),
            Err(Error::ExtentOverflow { .. })
        ));
    }

    #[test]
    fn capacity_error_names_the_dimension() {
        let m = meta(DType::I32, &[70, 8], &[8, 1], 0x1000);
        let err = Operand::new("bind", "page_table", &m).dim_at_most(0, 64, "rows").err().unwrap();
        assert_eq!(err.to_string(), "bind: page_table.shape[0] (rows) expected at most 64, got 70");
    }

    #[test]
    fn switches_accept_a_documented_set_and_name_the_variable_otherwise() {
        for v in ["1", "on", "TRUE", " yes "] {
            assert_eq!(parse_switch("B12X_X", v).unwrap(), Some(true), "{v}");
        }
        for v in ["0", "Off", "false", "no"] {
            assert_eq!(parse_switch("B12X_X", v).unwrap(), Some(false), "{v}");
        }
        assert_eq!(parse_switch("B12X_X", "  ").unwrap(), None);
        assert_eq!(
            parse_switch("B12X_X", "maybe").unwrap_err().to_string(),
            "environment: B12X_X expected one of 1/on/true/yes (on) or 0/off/false/no (off), \
             or unset, got \"maybe\""
        );
    }
}
