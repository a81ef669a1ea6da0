//! Declared collective plans: the invocation record's rules, the exact plan
//! key and the lock-free index that finds a prepared plan in one hash probe.
//!
//! Plans are declared up front (at preparation time); a live call builds a
//! key from its tensor's metadata and either finds the plan declared for
//! exactly that key or declines (the caller falls back to NCCL). Nothing is
//! ever inserted on a lookup, so the index holds only declared keys however
//! many live shapes are probed. Reference semantics:
//! `spec/reference-collectives.md` §2 and §4.

mod declaration;
mod index;
mod key;

pub use declaration::{Declaration, Field, SUPPORTED_DTYPES};
pub use index::{DeclaredPlanIndex, Entry, Hit, Reader, Snapshot, DECLARED_LISTED};
pub use key::{address_strides, epsilon_bits, Norm, PlanKey, Unindexable};

use std::fmt;

/// The collective operations a plan can be declared for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// A plain sum all-reduce.
    AllReduce,
    /// All-reduce, then residual add and RMSNorm with a declared weight.
    AllReduceFusedAddRmsNorm,
}

impl Operation {
    pub const ALL: [Operation; 2] = [Operation::AllReduce, Operation::AllReduceFusedAddRmsNorm];

    /// The name callers pass (`"all_reduce"`, `"all_reduce_fused_add_rms_norm"`).
    pub const fn name(self) -> &'static str {
        match self {
            Operation::AllReduce => "all_reduce",
            Operation::AllReduceFusedAddRmsNorm => "all_reduce_fused_add_rms_norm",
        }
    }

    pub fn parse(name: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|op| op.name() == name)
    }

    /// Whether the key carries the norm weight identity and epsilon.
    pub const fn is_fused(self) -> bool {
        matches!(self, Operation::AllReduceFusedAddRmsNorm)
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Formats dims the way Python prints a tuple: `(2, 4)`, `(8,)`, `()`.
pub(crate) fn fmt_tuple(dims: &[i64]) -> String {
    match dims {
        [] => "()".to_string(),
        [one] => format!("({one},)"),
        many => {
            let parts: Vec<String> = many.iter().map(i64::to_string).collect();
            format!("({})", parts.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_names_round_trip() {
        for op in Operation::ALL {
            assert_eq!(Operation::parse(op.name()), Some(op));
        }
        assert_eq!(Operation::parse("all_gather"), None);
        assert_eq!(Operation::parse("ALL_REDUCE"), None);
        assert!(Operation::AllReduceFusedAddRmsNorm.is_fused());
        assert!(!Operation::AllReduce.is_fused());
    }

    #[test]
    fn tuples_print_like_python() {
        assert_eq!(fmt_tuple(&[]), "()");
        assert_eq!(fmt_tuple(&[8]), "(8,)");
        assert_eq!(fmt_tuple(&[2, 4]), "(2, 4)");
    }
}
