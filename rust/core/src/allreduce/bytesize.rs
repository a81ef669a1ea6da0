//! The byte-size grammar of the limit knobs (spec §5.1).
//!
//! `ws* [+-]? digits ws* suffix? ws*`, case-insensitive; suffix "" or "b" is
//! bytes, k/kb/kib = 2^10, m/mb/mib = 2^20, g.. = 2^30, t.. = 2^40 (KB is KiB).

use crate::error::{Error, Name, Result};

/// Who asks for a size, for messages: `parse_byte_size: value ...` or
/// `AllReduce: B12X_ALLREDUCE_... ...` (an environment knob names itself).
#[derive(Debug, Clone)]
pub struct Source {
    pub op: &'static str,
    pub operand: Name,
}

impl Source {
    pub const VALUE: Source = Source { op: "parse_byte_size", operand: Name::Borrowed("value") };

    pub(crate) fn invalid(&self, what: impl Into<Name>, text: &str) -> Error {
        Error::InvalidValue {
            op: self.op,
            operand: self.operand.clone(),
            expected: what.into(),
            got: format!("{text:?}"),
        }
    }
}

fn multiplier(suffix: &str) -> Option<i64> {
    Some(match suffix {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    })
}

/// Parses a byte size such as "17", "84KB", "6 MiB" or "2g". Signed, so a
/// caller can reject negatives with its own message.
pub fn parse_byte_size(text: &str) -> Result<i64> {
    parse_byte_size_for(text, &Source::VALUE)
}

/// [`parse_byte_size`] with the errors naming `source`.
pub fn parse_byte_size_for(text: &str, source: &Source) -> Result<i64> {
    let invalid = |what: &'static str, text: &str| source.invalid(what, text);
    let lower = text.trim().to_ascii_lowercase();
    let (sign, rest) = match lower.as_bytes().first() {
        Some(b'-') => (-1i64, &lower[1..]),
        Some(b'+') => (1, &lower[1..]),
        _ => (1, lower.as_str()),
    };
    let digits_end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    if digits_end == 0 {
        return Err(invalid("a byte size such as 17, 84KB or 6 MiB (invalid byte size)", text));
    }
    let suffix = rest[digits_end..].trim_start();
    if !suffix.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(invalid("a byte size such as 17, 84KB or 6 MiB (invalid byte size)", text));
    }
    let Some(unit) = multiplier(suffix) else {
        return Err(invalid(
            "a byte-size suffix among b, k/kb/kib, m/mb/mib, g/gb/gib, t/tb/tib \
             (invalid byte-size suffix)",
            text,
        ));
    };
    rest[..digits_end]
        .parse::<i64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .map(|n| sign * n)
        .ok_or_else(|| invalid("a byte size below 2^63 (invalid byte size)", text))
}

/// Whether `text` is one of the words that turn an optional size off:
/// "", "off", "none" or "disabled" (any case).
pub fn is_off(text: &str) -> bool {
    matches!(text.trim().to_ascii_lowercase().as_str(), "" | "off" | "none" | "disabled")
}

/// Like [`parse_byte_size`], but "", "0", "off", "none" and "disabled" mean
/// off (0); negatives are rejected.
pub fn parse_optional_byte_size(text: &str) -> Result<u64> {
    if is_off(text) {
        return Ok(0);
    }
    parse_non_negative(text, &Source::VALUE)
}

/// [`parse_byte_size`] for limits: a negative value is an error.
pub fn parse_non_negative(text: &str, source: &Source) -> Result<u64> {
    let n = parse_byte_size_for(text, source)?;
    u64::try_from(n).map_err(|_| source.invalid("a non-negative byte size", text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_examples() {
        assert_eq!(parse_byte_size("17").unwrap(), 17);
        assert_eq!(parse_byte_size("84KB").unwrap(), 86016);
        assert_eq!(parse_byte_size("6 MiB").unwrap(), 6291456);
        assert_eq!(parse_byte_size("2g").unwrap(), 1 << 31);
        assert_eq!(parse_byte_size("  +3 t ").unwrap(), 3 << 40);
        assert_eq!(parse_byte_size("-4k").unwrap(), -4096);
        assert_eq!(parse_byte_size("5b").unwrap(), 5);
    }

    #[test]
    fn bad_suffix_and_junk() {
        let e = parse_byte_size("5x").unwrap_err().to_string();
        assert!(e.contains("invalid byte-size suffix"), "{e}");
        assert!(parse_byte_size("5ki").unwrap_err().to_string().contains("suffix"));
        assert!(parse_byte_size("5 kibb").unwrap_err().to_string().contains("suffix"));
        for junk in ["", "kb", "1.5k", "1 2", "0x10", "-"] {
            let e = parse_byte_size(junk).unwrap_err().to_string();
            assert!(e.contains("invalid byte size"), "{junk:?}: {e}");
        }
        assert!(parse_byte_size("99999999999t").is_err());
    }

    #[test]
    fn a_source_names_itself() {
        let src = Source { op: "AllReduce", operand: "VLLM_X".into() };
        let e = parse_byte_size_for("12 parsecs", &src).unwrap_err().to_string();
        assert!(e.starts_with("AllReduce: VLLM_X expected a byte-size suffix"), "{e}");
        assert!(e.ends_with("got \"12 parsecs\""), "{e}");
    }

    #[test]
    fn optional_and_non_negative() {
        for off in ["", "0", "off", "None", " disabled "] {
            assert_eq!(parse_optional_byte_size(off).unwrap(), 0, "{off:?}");
        }
        assert_eq!(parse_optional_byte_size("768KB").unwrap(), 786432);
        assert!(parse_non_negative("-1", &Source::VALUE).is_err());
        assert!(parse_optional_byte_size("-1").is_err());
    }
}
