//! The rules a declared invocation must meet (spec §2), in the reference's
//! order, as plain Rust over plain values: the Python record calls into
//! them, so they exist once.

use std::borrow::Cow;

use super::key::{Norm, PlanKey};
use super::{fmt_tuple, Operation};
use crate::error::{Error, Result};
use crate::tensor::{DType, TensorMeta, MAX_RANK};

/// The dtypes a PCIe collective can be declared for.
pub const SUPPORTED_DTYPES: [DType; 3] = [DType::F16, DType::BF16, DType::F32];

/// A field as the caller gave it: a value of the right type, or `Err` with
/// the caller's rendering of something else (Python's `repr`), which fails
/// the field's rule and is quoted in the message.
pub type Field<T> = std::result::Result<T, String>;

/// One declared invocation, as read from the caller.
#[derive(Debug, Clone)]
pub struct Declaration<'a> {
    pub name: Field<&'a str>,
    pub operation: Field<&'a str>,
    /// Extents; `Err` when the shape or any extent is not exactly an int.
    pub shape: Field<&'a [i64]>,
    pub dtype: Field<DType>,
    /// `None`: row-major contiguous.
    pub strides: Option<Field<&'a [i64]>>,
    pub alignment: Field<i64>,
    /// `None`: no weight. `Ok(identity)` for a tensor, `Err` for anything else.
    pub norm_weight: Option<Field<u64>>,
    /// The norm weight's shape, when it is a tensor whose metadata was read.
    pub norm_weight_shape: Option<&'a [i64]>,
    pub epsilon: Option<Field<f64>>,
}

const OP: &str = "PCIe invocation";

impl Declaration<'_> {
    /// Checks every rule and returns the key the declaration is indexed by.
    ///
    /// Every error is `Error::InvalidValue` (a ValueError in Python) except a
    /// fused norm weight that is not a tensor (`Error::NotATensor`, a TypeError).
    pub fn validate(&self) -> Result<PlanKey> {
        let label = match self.name {
            Ok(name) => format!("'{name}'"),
            Err(ref got) => got.clone(),
        };
        let invalid = |field: &str, expected: Cow<'static, str>, got: String| Error::InvalidValue {
            op: OP,
            operand: format!("{field} of invocation {label}").into(),
            expected,
            got,
        };

        // 1. the operation
        let operation = match self.operation {
            Ok(name) => Operation::parse(name).ok_or_else(|| format!("'{name}'")),
            Err(ref got) => Err(got.clone()),
        }
        .map_err(|got| {
            invalid(
                "operation",
                "a supported PCIe collective operation ('all_reduce' or \
                 'all_reduce_fused_add_rms_norm')"
                    .into(),
                got,
            )
        })?;

        // 2. a nonempty name and a positive shape
        match self.name {
            Ok(name) if !name.is_empty() => {}
            Ok(_) => return Err(invalid("name", "a nonempty name".into(), "''".into())),
            Err(ref got) => return Err(invalid("name", "a nonempty name".into(), got.clone())),
        }
        let positive_shape = "a positive shape (a tuple of ints > 0)";
        let shape = match self.shape {
            Ok(shape) if shape.iter().any(|&d| d <= 0) => {
                return Err(invalid("shape", positive_shape.into(), fmt_tuple(shape)));
            }
            Ok(shape) if shape.len() > MAX_RANK => {
                let expected = format!("a positive shape of at most {MAX_RANK} dimensions");
                return Err(invalid("shape", expected.into(), fmt_tuple(shape)));
            }
            Ok(shape) => shape,
            Err(ref got) => return Err(invalid("shape", positive_shape.into(), got.clone())),
        };

        // 3. the dtype
        let dtype = match self.dtype {
            Ok(dtype) if SUPPORTED_DTYPES.contains(&dtype) => dtype,
            ref other => {
                let got = match other {
                    Ok(dtype) => dtype.to_string(),
                    Err(got) => got.clone(),
                };
                let expected = "a supported dtype (float16, bfloat16 or float32)";
                return Err(invalid("dtype", expected.into(), got));
            }
        };

        // 4. strides that match the shape
        let contiguous;
        let strides = match self.strides {
            None => {
                contiguous = TensorMeta::contiguous_strides(shape);
                contiguous.as_slice()
            }
            Some(Ok(strides)) if strides.len() == shape.len() && strides.iter().all(|&s| s > 0) => {
                strides
            }
            Some(ref bad) => {
                let got = match bad {
                    Ok(strides) => fmt_tuple(strides),
                    Err(got) => got.clone(),
                };
                let expected = format!(
                    "strides matching its shape {} ({} ints > 0)",
                    fmt_tuple(shape),
                    shape.len()
                );
                return Err(invalid("strides", expected.into(), got));
            }
        };

        // 5. the input alignment
        match self.alignment {
            Ok(a) if a >= 16 && (a as u64).is_power_of_two() => {}
            ref bad => {
                let got = match bad {
                    Ok(a) => a.to_string(),
                    Err(got) => got.clone(),
                };
                return Err(invalid("input_alignment", "a power of two >= 16".into(), got));
            }
        }

        // 6. a norm weight exactly when fused
        let fused = operation.is_fused();
        match (&self.norm_weight, fused) {
            (None, true) => {
                let expected = "exactly one norm weight (fused PCIe invocation)";
                return Err(invalid("norm_weight", expected.into(), "None".into()));
            }
            (Some(_), false) => {
                let expected = "None (only the fused PCIe invocation takes a norm weight)";
                return Err(invalid("norm_weight", expected.into(), "a norm weight".into()));
            }
            (Some(Err(got)), true) => {
                return Err(Error::NotATensor {
                    op: OP,
                    operand: format!("norm_weight of invocation {label}").into(),
                    got: got.clone(),
                });
            }
            _ => {}
        }
        // 6b. the weight scales each row: one value per element of the last dimension
        if let (true, Some(weight)) = (fused, self.norm_weight_shape) {
            let hidden = shape.last().copied().unwrap_or(0);
            if weight != [hidden] {
                return Err(invalid(
                    "norm_weight",
                    format!("shape ({hidden},) (one weight per element of a row)").into(),
                    format!("shape {}", fmt_tuple(weight)),
                ));
            }
        }

        // 7. a nonnegative epsilon when fused (NaN is not: it would equal nothing)
        // 8. no RMSNorm controls when plain
        let norm = match (&self.epsilon, &self.norm_weight) {
            (Some(Ok(eps)), Some(Ok(weight))) if fused && *eps >= 0.0 => {
                Some(Norm::new(*weight, *eps))
            }
            (eps, _) if fused => {
                let got = match eps {
                    None => "None".to_string(),
                    Some(Ok(eps)) => format!("{eps:?}"),
                    Some(Err(got)) => got.clone(),
                };
                return Err(invalid("epsilon", "a nonnegative epsilon".into(), got));
            }
            (None, _) => None,
            (Some(eps), _) => {
                let got = match eps {
                    Ok(eps) => format!("{eps:?}"),
                    Err(got) => got.clone(),
                };
                let expected = "None (a plain PCIe invocation cannot carry RMSNorm controls)";
                return Err(invalid("epsilon", expected.into(), got));
            }
        };

        PlanKey::new(operation, dtype, shape, strides, norm).map_err(|why| {
            // unreachable after the checks above; kept as an error, never a panic
            invalid("shape", why.expected().into(), fmt_tuple(shape))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain<'a>(shape: &'a [i64]) -> Declaration<'a> {
        Declaration {
            name: Ok("layer0.all_reduce"),
            operation: Ok("all_reduce"),
            shape: Ok(shape),
            dtype: Ok(DType::BF16),
            strides: None,
            alignment: Ok(16),
            norm_weight: None,
            norm_weight_shape: None,
            epsilon: None,
        }
    }

    fn fused<'a>(shape: &'a [i64]) -> Declaration<'a> {
        Declaration {
            operation: Ok("all_reduce_fused_add_rms_norm"),
            norm_weight: Some(Ok(0x1000)),
            epsilon: Some(Ok(1e-6)),
            ..plain(shape)
        }
    }

    fn message(d: &Declaration<'_>) -> String {
        match d.validate() {
            Err(Error::InvalidValue { .. }) => d.validate().unwrap_err().to_string(),
            other => panic!("expected InvalidValue, got {other:?}"),
        }
    }

    #[test]
    fn valid_declarations_give_their_key() {
        let key = plain(&[2, 4]).validate().unwrap();
        assert_eq!(key.operation(), Operation::AllReduce);
        assert_eq!(key.dtype(), DType::BF16);
        assert_eq!(key.shape().as_slice(), &[2, 4]);
        assert_eq!(key.address_strides().as_slice(), &[4, 1]);
        assert_eq!(key.norm(), None);

        let key = Declaration { strides: Some(Ok(&[10, 1])), ..plain(&[1, 8]) }.validate().unwrap();
        assert_eq!(key.address_strides().as_slice(), &[0, 1]);

        let key = fused(&[2, 4]).validate().unwrap();
        assert_eq!(key.norm(), Some(Norm::new(0x1000, 1e-6)));

        // an empty shape passes (a scalar), as in the reference
        assert!(plain(&[]).validate().is_ok());
        assert!(Declaration { alignment: Ok(256), ..plain(&[4]) }.validate().is_ok());
        assert!(Declaration { epsilon: Some(Ok(0.0)), ..fused(&[4]) }.validate().is_ok());
    }

    #[test]
    fn rule_1_operation() {
        let m = message(&Declaration { operation: Ok("all_gather"), ..plain(&[4]) });
        assert_eq!(
            m,
            "PCIe invocation: operation of invocation 'layer0.all_reduce' expected a supported \
             PCIe collective operation ('all_reduce' or 'all_reduce_fused_add_rms_norm'), got 'all_gather'"
        );
        let m = message(&Declaration { operation: Err("None".into()), ..plain(&[4]) });
        assert!(m.ends_with("got None"), "{m}");
        // the operation is checked before anything else
        let m = message(&Declaration { operation: Ok("x"), name: Ok(""), ..plain(&[0]) });
        assert!(m.contains("operation"), "{m}");
    }

    #[test]
    fn rule_2_name_and_shape() {
        let m = message(&Declaration { name: Ok(""), ..plain(&[4]) });
        assert!(m.contains("name of invocation '' expected a nonempty name, got ''"), "{m}");
        let m = message(&Declaration { name: Err("3".into()), ..plain(&[4]) });
        assert!(m.contains("expected a nonempty name, got 3"), "{m}");
        for bad in [&[2, 0][..], &[-1], &[4, 4, 0]] {
            let m = message(&plain(bad));
            assert!(m.contains("shape of invocation 'layer0.all_reduce' expected a positive shape"));
            assert!(m.contains(&format!("got {}", fmt_tuple(bad))), "{m}");
        }
        let m = message(&Declaration { shape: Err("(2, True)".into()), ..plain(&[4]) });
        assert!(m.ends_with("got (2, True)"), "{m}");
        let m = message(&plain(&[1; 9]));
        assert!(m.contains("at most 8 dimensions"), "{m}");
        // the shape is checked before the dtype
        let m = message(&Declaration { dtype: Ok(DType::F64), ..plain(&[0]) });
        assert!(m.contains("shape"), "{m}");
    }

    #[test]
    fn rule_3_dtype() {
        for bad in [Ok(DType::F64), Ok(DType::F8E4M3), Ok(DType::I32), Err("'bf16'".to_string())] {
            let m = message(&Declaration { dtype: bad.clone(), ..plain(&[4]) });
            assert!(m.contains("dtype of invocation"), "{m}");
            assert!(m.contains("expected a supported dtype (float16, bfloat16 or float32)"));
        }
        for good in SUPPORTED_DTYPES {
            assert!(Declaration { dtype: Ok(good), ..plain(&[4]) }.validate().is_ok());
        }
    }

    #[test]
    fn rule_4_strides() {
        let cases: [Field<&[i64]>; 5] =
            [Ok(&[1]), Ok(&[4, 0]), Ok(&[-4, 1]), Ok(&[4, 1, 1]), Err("(4, 1.0)".into())];
        for bad in cases {
            let m = message(&Declaration { strides: Some(bad.clone()), ..plain(&[2, 4]) });
            assert!(m.contains("strides of invocation"), "{m}");
            assert!(m.contains("expected strides matching its shape (2, 4) (2 ints > 0)"), "{m}");
        }
        assert!(Declaration { strides: Some(Ok(&[8, 1])), ..plain(&[2, 4]) }.validate().is_ok());
    }

    #[test]
    fn rule_5_alignment() {
        for bad in [Ok(8), Ok(0), Ok(-16), Ok(24), Ok(48), Err("16.0".to_string())] {
            let m = message(&Declaration { alignment: bad.clone(), ..plain(&[4]) });
            assert!(m.contains("input_alignment of invocation"), "{m}");
            assert!(m.contains("expected a power of two >= 16"), "{m}");
        }
    }

    #[test]
    fn rule_6b_the_weight_has_one_value_per_row_element() {
        assert!(Declaration { norm_weight_shape: Some(&[4]), ..fused(&[2, 4]) }.validate().is_ok());
        for bad in [&[3][..], &[4, 1], &[1, 4], &[]] {
            let m = message(&Declaration { norm_weight_shape: Some(bad), ..fused(&[2, 4]) });
            assert!(m.contains("norm_weight of invocation 'layer0.all_reduce' expected shape (4,)"));
        }
    }

    #[test]
    fn rule_6_norm_weight_exactly_when_fused() {
        let m = message(&Declaration { norm_weight: None, ..fused(&[4]) });
        assert!(m.contains("expected exactly one norm weight (fused PCIe invocation), got None"));
        let m = message(&Declaration { norm_weight: Some(Ok(1)), ..plain(&[4]) });
        assert!(m.contains("norm_weight of invocation"), "{m}");
        assert!(m.contains("only the fused PCIe invocation takes a norm weight"), "{m}");
        let e = Declaration { norm_weight: Some(Err("list".into())), ..fused(&[4]) }
            .validate()
            .unwrap_err();
        assert!(matches!(e, Error::NotATensor { .. }), "{e:?}");
        assert!(e
            .to_string()
            .contains("norm_weight of invocation 'layer0.all_reduce' expected a tensor"));
    }

    #[test]
    fn rule_7_nonnegative_epsilon_when_fused() {
        for bad in [None, Some(Ok(-1e-6)), Some(Ok(f64::NAN)), Some(Err("'small'".to_string()))] {
            let m = message(&Declaration { epsilon: bad.clone(), ..fused(&[4]) });
            assert!(m.contains("epsilon of invocation"), "{m}");
            assert!(m.contains("expected a nonnegative epsilon"), "{m}");
        }
    }

    #[test]
    fn rule_8_plain_has_no_rmsnorm_controls() {
        let m = message(&Declaration { epsilon: Some(Ok(1e-6)), ..plain(&[4]) });
        assert!(m.contains("a plain PCIe invocation cannot carry RMSNorm controls"), "{m}");
        assert!(m.ends_with("got 1e-6"), "{m}");
    }
}
