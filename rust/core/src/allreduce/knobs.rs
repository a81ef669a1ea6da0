//! The environment knobs the all-reduce reads, each with its grammar.
//!
//! Every value is checked where it is read: a garbage value is an error that
//! names the variable and the accepted form, never a default in disguise.
//! The wait bound ([`timeout_ns`]) is finite and at most an hour, so its
//! nanoseconds fit every integer the ranks exchange when they agree on it.

use crate::error::{Error, Result};

use super::bytesize::{is_off, parse_non_negative, Source};
use super::limits::{LimitField, Limits, MAX_LIMIT_BYTES, MAX_ROW_ELEMS};

/// The op that messages about knobs and run-time settings name.
pub const OP: &str = "AllReduce";
/// Bound of every cross-GPU wait when nothing says otherwise.
pub const DEFAULT_TIMEOUT_S: f64 = 60.0;
/// Longest accepted wait bound: a wait longer than this is a hang.
pub const MAX_TIMEOUT_S: f64 = 3600.0;

/// The environment variables of the all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Knob {
    OneshotMax,
    FusedMax,
    TwoshotMax,
    TwoshotRowElems,
    TimeoutS,
    TwoshotPush,
    /// Test hook: the rank named here fails its slab allocation (proves that
    /// one rank's set-up failure disables the runtime on every rank).
    FailSetupRank,
}

impl Knob {
    pub const ALL: [Knob; 7] = [
        Knob::OneshotMax,
        Knob::FusedMax,
        Knob::TwoshotMax,
        Knob::TwoshotRowElems,
        Knob::TimeoutS,
        Knob::TwoshotPush,
        Knob::FailSetupRank,
    ];

    /// The variable's name.
    pub const fn var(self) -> &'static str {
        match self {
            Knob::OneshotMax => "B12X_ALLREDUCE_ONESHOT_MAX_SIZE",
            Knob::FusedMax => "B12X_ALLREDUCE_FUSED_MAX_SIZE",
            Knob::TwoshotMax => "B12X_ALLREDUCE_TWOSHOT_MAX_SIZE",
            Knob::TwoshotRowElems => "B12X_ALLREDUCE_TWOSHOT_ROW_ELEMS",
            Knob::TimeoutS => "B12X_ALLREDUCE_TIMEOUT_S",
            Knob::TwoshotPush => "B12X_ALLREDUCE_TWOSHOT_PUSH",
            Knob::FailSetupRank => "B12X_ALLREDUCE_TEST_FAIL_SETUP_RANK",
        }
    }

    /// The variable's earlier name, still read (with a warning naming
    /// [`var`](Knob::var)) where the new one is unset. vLLM warns about every
    /// unknown `VLLM_*` variable, and refuses to start when told to.
    pub const fn deprecated_var(self) -> Option<&'static str> {
        match self {
            Knob::OneshotMax => Some("VLLM_PCIE_ONESHOT_ALLREDUCE_MAX_SIZE"),
            Knob::FusedMax => Some("VLLM_PCIE_ONESHOT_FUSED_ADD_RMS_NORM_MAX_SIZE"),
            Knob::TwoshotMax => Some("VLLM_PCIE_TWOSHOT_ALLREDUCE_MAX_SIZE"),
            Knob::TwoshotRowElems => Some("VLLM_PCIE_TWOSHOT_ROW_ELEMS"),
            _ => None,
        }
    }

    /// What the knob sets, as a short key (the Limits field for limits).
    pub const fn key(self) -> &'static str {
        match self {
            Knob::OneshotMax => LimitField::OneshotMax.name(),
            Knob::FusedMax => LimitField::FusedMax.name(),
            Knob::TwoshotMax => LimitField::TwoshotMax.name(),
            Knob::TwoshotRowElems => LimitField::TwoshotRowElems.name(),
            Knob::TimeoutS => "timeout_s",
            Knob::TwoshotPush => "twoshot_push",
            Knob::FailSetupRank => "fail_setup_rank",
        }
    }

    /// The accepted form, as messages print it.
    pub const fn accepted(self) -> &'static str {
        match self {
            Knob::OneshotMax | Knob::FusedMax => {
                "a byte size in 0..=1 TiB such as 17, 84KB or 6 MiB (0 turns the route off)"
            }
            Knob::TwoshotMax => {
                "a byte size in 0..=1 TiB such as 768KB, or 0, off, none, disabled or empty (off)"
            }
            Knob::TwoshotRowElems => "an element count in 1..=2^31, such as 4096",
            Knob::TimeoutS => "seconds, a finite number in (0, 3600], such as 60 or 2.5",
            Knob::TwoshotPush => "0 (pull), 1 (push) or auto",
            Knob::FailSetupRank => "a rank, a non-negative integer",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// The values of the knobs' variables in one environment (unset = None),
/// each with the variable it was read from: its name, or where that is
/// unset its [deprecated](Knob::deprecated_var) one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvValues {
    values: [Option<(String, &'static str)>; Knob::ALL.len()],
}

impl EnvValues {
    /// Reads `knobs` through `get` (a variable name -> its value), each from
    /// its name, else from its deprecated name.
    pub fn read<E>(
        knobs: &[Knob],
        mut get: impl FnMut(&'static str) -> Result<Option<String>, E>,
    ) -> Result<Self, E> {
        let mut env = EnvValues::default();
        for &knob in knobs {
            for name in std::iter::once(knob.var()).chain(knob.deprecated_var()) {
                if let Some(value) = get(name)? {
                    env.values[knob.index()] = Some((value, name));
                    break;
                }
            }
        }
        Ok(env)
    }

    /// Sets `knob` as if read from its variable.
    pub fn set(&mut self, knob: Knob, value: impl Into<String>) -> &mut Self {
        self.values[knob.index()] = Some((value.into(), knob.var()));
        self
    }

    pub fn get(&self, knob: Knob) -> Option<&str> {
        self.values[knob.index()].as_ref().map(|(value, _)| value.as_str())
    }

    /// The variable `knob`'s value came from (its name when unset).
    pub fn name(&self, knob: Knob) -> &'static str {
        self.values[knob.index()].as_ref().map_or(knob.var(), |&(_, name)| name)
    }

    /// (deprecated name, name) of every knob read from its deprecated name.
    pub fn deprecated_in_use(&self) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
        Knob::ALL.into_iter().filter_map(|knob| {
            let name = self.name(knob);
            (name != knob.var()).then_some((name, knob.var()))
        })
    }

    fn source(&self, knob: Knob) -> Source {
        Source { op: OP, operand: self.name(knob).into() }
    }

    /// The error for `knob`'s value `text`, naming the variable it came from.
    fn refuse(&self, knob: Knob, text: &str) -> Error {
        self.source(knob).invalid(knob.accepted(), text)
    }
}

fn byte_limit(env: &EnvValues, knob: Knob, default: u64) -> Result<u64> {
    let Some(text) = env.get(knob) else {
        return Ok(default);
    };
    if knob == Knob::TwoshotMax && is_off(text) {
        return Ok(0);
    }
    let value = parse_non_negative(text, &env.source(knob))?;
    if value > MAX_LIMIT_BYTES {
        return Err(env.refuse(knob, text));
    }
    Ok(value)
}

/// Limits from the environment, defaults where a variable is unset.
pub fn limits_from_env(env: &EnvValues) -> Result<Limits> {
    let d = Limits::DEFAULT;
    let row_elems = match env.get(Knob::TwoshotRowElems) {
        None => d.twoshot_row_elems(),
        Some(text) => text
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|n| (1..=MAX_ROW_ELEMS).contains(n))
            .ok_or_else(|| env.refuse(Knob::TwoshotRowElems, text))?,
    };
    Limits::new(
        byte_limit(env, Knob::OneshotMax, d.oneshot_max())?,
        byte_limit(env, Knob::FusedMax, d.fused_max())?,
        byte_limit(env, Knob::TwoshotMax, d.twoshot_max())?,
        row_elems,
    )
}

/// Nanoseconds of a wait bound of `seconds`: finite, above 0, at most
/// [`MAX_TIMEOUT_S`]; `operand` names the argument or variable it came from.
pub fn timeout_ns(seconds: f64, operand: &'static str) -> Result<u64> {
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= MAX_TIMEOUT_S) {
        return Err(Error::InvalidValue {
            op: OP,
            operand: operand.into(),
            expected: Knob::TimeoutS.accepted().into(),
            got: seconds.to_string(),
        });
    }
    // at most 3.6e12: exact in f64 and in i64
    Ok(((seconds * 1e9).round() as u64).max(1))
}

/// The wait bound from the environment ([`DEFAULT_TIMEOUT_S`] when unset).
pub fn timeout_ns_from_env(env: &EnvValues) -> Result<u64> {
    let knob = Knob::TimeoutS;
    let Some(text) = env.get(knob) else {
        return timeout_ns(DEFAULT_TIMEOUT_S, knob.var());
    };
    let seconds = text.trim().parse::<f64>().map_err(|_| env.refuse(knob, text))?;
    timeout_ns(seconds, knob.var()).map_err(|_| env.refuse(knob, text))
}

/// The two-shot transport from the environment: Some(push) or None for auto
/// (also when unset).
pub fn twoshot_push_from_env(env: &EnvValues) -> Result<Option<bool>> {
    let knob = Knob::TwoshotPush;
    let Some(text) = env.get(knob) else {
        return Ok(None);
    };
    match text.trim().to_ascii_lowercase().as_str() {
        "0" => Ok(Some(false)),
        "1" => Ok(Some(true)),
        "auto" => Ok(None),
        _ => Err(env.refuse(knob, text)),
    }
}

/// The rank the set-up test hook fails, if set.
pub fn fail_setup_rank_from_env(env: &EnvValues) -> Result<Option<u32>> {
    let knob = Knob::FailSetupRank;
    env.get(knob)
        .map(|text| text.trim().parse::<u32>().map_err(|_| env.refuse(knob, text)))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(Knob, &str)]) -> EnvValues {
        let mut e = EnvValues::default();
        for &(k, v) in pairs {
            e.set(k, v);
        }
        e
    }

    #[test]
    fn defaults_when_unset() {
        let e = EnvValues::default();
        assert_eq!(limits_from_env(&e).unwrap(), Limits::DEFAULT);
        assert_eq!(timeout_ns_from_env(&e).unwrap(), 60_000_000_000);
        assert_eq!(twoshot_push_from_env(&e).unwrap(), None);
        assert_eq!(fail_setup_rank_from_env(&e).unwrap(), None);
    }

    #[test]
    fn a_deprecated_name_is_read_where_the_name_is_unset_and_errors_name_it() {
        let vars = [
            ("VLLM_PCIE_ONESHOT_ALLREDUCE_MAX_SIZE", "84 KX"),
            ("B12X_ALLREDUCE_FUSED_MAX_SIZE", "72KB"),
            ("VLLM_PCIE_ONESHOT_FUSED_ADD_RMS_NORM_MAX_SIZE", "1KB"),
        ];
        let lookup = |name: &str| {
            Ok::<_, ()>(vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
        };
        let e = EnvValues::read(&Knob::ALL, lookup).unwrap();
        // the new name wins over the old one; the old one fills in where unset
        assert_eq!(e.get(Knob::FusedMax), Some("72KB"));
        assert_eq!(e.name(Knob::FusedMax), "B12X_ALLREDUCE_FUSED_MAX_SIZE");
        assert_eq!(e.get(Knob::OneshotMax), Some("84 KX"));
        let in_use: Vec<_> = e.deprecated_in_use().collect();
        assert_eq!(
            in_use,
            [("VLLM_PCIE_ONESHOT_ALLREDUCE_MAX_SIZE", "B12X_ALLREDUCE_ONESHOT_MAX_SIZE")]
        );
        // the error names the variable the user set
        let msg = limits_from_env(&e).unwrap_err().to_string();
        assert!(msg.contains("VLLM_PCIE_ONESHOT_ALLREDUCE_MAX_SIZE"), "{msg}");
        // only the knobs asked for are read
        let e = EnvValues::read(&[Knob::TimeoutS], lookup).unwrap();
        assert_eq!(e.get(Knob::OneshotMax), None);
    }

    #[test]
    fn values_parse_by_their_grammar() {
        let e = env(&[
            (Knob::OneshotMax, "16KB"),
            (Knob::FusedMax, "72KB"),
            (Knob::TwoshotMax, "768KB"),
            (Knob::TwoshotRowElems, " 896 "),
            (Knob::TimeoutS, "2.5"),
            (Knob::TwoshotPush, "Auto"),
            (Knob::FailSetupRank, "1"),
        ]);
        assert_eq!(limits_from_env(&e).unwrap(), Limits::new(16384, 73728, 786432, 896).unwrap());
        assert_eq!(timeout_ns_from_env(&e).unwrap(), 2_500_000_000);
        assert_eq!(twoshot_push_from_env(&e).unwrap(), None);
        assert_eq!(fail_setup_rank_from_env(&e).unwrap(), Some(1));
        for off in ["", "0", "off", "None", " disabled "] {
            let e = env(&[(Knob::TwoshotMax, off)]);
            assert_eq!(limits_from_env(&e).unwrap().twoshot_max(), 0, "{off:?}");
        }
        assert_eq!(twoshot_push_from_env(&env(&[(Knob::TwoshotPush, "1")])).unwrap(), Some(true));
        assert_eq!(twoshot_push_from_env(&env(&[(Knob::TwoshotPush, "0")])).unwrap(), Some(false));
    }

    /// Every knob refuses garbage with its variable and its accepted form.
    #[test]
    fn garbage_names_the_variable_and_the_accepted_form() {
        let garbage: [(Knob, &[&str]); 7] = [
            (Knob::OneshotMax, &["abc", "-1", "2t", "1.5k", ""]),
            (Knob::FusedMax, &["12 parsecs", "-4k"]),
            (Knob::TwoshotMax, &["auto", "-1", "3t"]),
            (Knob::TwoshotRowElems, &["0", "-3", "4k", "1e3", "4294967296"]),
            (Knob::TimeoutS, &["abc", "inf", "nan", "1e300", "0", "-1", "3601", ""]),
            (Knob::TwoshotPush, &["yes", "2", ""]),
            (Knob::FailSetupRank, &["one", "-1", ""]),
        ];
        for (knob, values) in garbage {
            for &text in values {
                let e = env(&[(knob, text)]);
                let err = match knob {
                    Knob::TimeoutS => timeout_ns_from_env(&e).map(|_| ()),
                    Knob::TwoshotPush => twoshot_push_from_env(&e).map(|_| ()),
                    Knob::FailSetupRank => fail_setup_rank_from_env(&e).map(|_| ()),
                    _ => limits_from_env(&e).map(|_| ()),
                }
                .expect_err(text)
                .to_string();
                assert!(err.starts_with(&format!("AllReduce: {} expected ", knob.var())), "{err}");
                assert!(err.contains(&format!("got {text:?}")), "{err}");
            }
        }
        let e = limits_from_env(&env(&[(Knob::FusedMax, "-1")])).unwrap_err().to_string();
        assert!(e.contains("non-negative"), "{e}");
        let e = limits_from_env(&env(&[(Knob::OneshotMax, "5x")])).unwrap_err().to_string();
        assert!(e.contains("invalid byte-size suffix"), "{e}");
    }

    #[test]
    fn timeouts_are_finite_positive_and_bounded() {
        assert_eq!(timeout_ns(30.0, "timeout_s").unwrap(), 30_000_000_000);
        assert_eq!(timeout_ns(3600.0, "timeout_s").unwrap(), 3_600_000_000_000);
        assert_eq!(timeout_ns(1e-12, "timeout_s").unwrap(), 1);
        for bad in [0.0, -1.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1e300, 3600.5] {
            let e = timeout_ns(bad, "timeout_s").unwrap_err().to_string();
            assert!(e.starts_with("AllReduce: timeout_s expected seconds"), "{bad}: {e}");
        }
        // the agreed contract carries the nanoseconds as int64
        assert!(timeout_ns(MAX_TIMEOUT_S, "t").unwrap() < i64::MAX as u64);
    }

    #[test]
    fn variables_are_distinct() {
        let mut vars: Vec<_> = Knob::ALL.iter().map(|k| k.var()).collect();
        vars.sort_unstable();
        vars.dedup();
        assert_eq!(vars.len(), Knob::ALL.len());
        for (i, k) in Knob::ALL.iter().enumerate() {
            assert_eq!(k.index(), i);
        }
    }
}
