//! `Caps`: what a caller declares once per (device, query geometry,
//! page-table capacity, serving mode), validated with precise errors.

use std::borrow::Cow;
use std::fmt;

use super::bucket::bucket;
use super::{
    MAX_HEADS, MAX_PAGE_TABLE_WIDTH, MAX_Q_ROWS, MAX_SUPERTILE, PAGE_SIZE, SUPERTILE_QUANTUM,
    SUPPORTED_TOPK,
};
use crate::error::{Error, Result};
use crate::tensor::Device;

const OP: &str = "Caps";

/// Decode: one page-table row per query row. Prefill: every query row of a
/// chunk reads one request's page-table row (a stride-0 shared table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    Decode,
    Prefill,
}

impl Mode {
    pub const fn name(self) -> &'static str {
        match self {
            Mode::Decode => "decode",
            Mode::Prefill => "prefill",
        }
    }

    pub fn parse(s: &str) -> Result<Mode> {
        match s {
            "decode" => Ok(Mode::Decode),
            "prefill" => Ok(Mode::Prefill),
            other => Err(invalid("mode", "one of {decode, prefill}", format!("{other:?}"))),
        }
    }
}

/// Logical: request-relative position `page_col*64 + slot`.
/// Physical: cache position `page_id*64 + slot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexSpace {
    Logical,
    Physical,
}

impl IndexSpace {
    pub const fn name(self) -> &'static str {
        match self {
            IndexSpace::Logical => "logical",
            IndexSpace::Physical => "physical",
        }
    }

    pub fn parse(s: &str) -> Result<IndexSpace> {
        match s {
            "logical" => Ok(IndexSpace::Logical),
            "physical" => Ok(IndexSpace::Physical),
            other => Err(invalid(
                "output_index_space",
                "one of {logical, physical}",
                format!("{other:?}"),
            )),
        }
    }
}

/// How exactly the scorers compute the logits.
///
/// Exact (the default): fp32 accumulation of exact FP8 products, the same
/// logits on every architecture and deterministic ties. Fast: a device may
/// use a faster MMA with reduced-precision accumulation (Hopper's FP8
/// wgmma); each logit stays within 1e-3 of the exact one relative to its
/// magnitude (the same sum over |weights| and |dot products|), and the
/// selected set equals the exact one's except for indices whose logit lies
/// within that tolerance of the k-th value. Where the hardware has no faster
/// path, fast is exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    Exact,
    Fast,
}

impl Precision {
    pub const fn name(self) -> &'static str {
        match self {
            Precision::Exact => "exact",
            Precision::Fast => "fast",
        }
    }

    pub fn parse(s: &str) -> Result<Precision> {
        match s {
            "exact" => Ok(Precision::Exact),
            "fast" => Ok(Precision::Fast),
            other => Err(invalid("precision", "one of {exact, fast}", format!("{other:?}"))),
        }
    }
}

/// The caller's values, unchecked (Python ints arrive as i64 so that a
/// negative or huge value gets a precise error instead of an overflow).
#[derive(Debug, Clone, Copy)]
pub struct CapsRequest {
    pub device: Device,
    pub num_q_heads: i64,
    pub max_q_rows: i64,
    pub max_page_table_width: i64,
    pub topk: i64,
    pub mode: Mode,
    pub index_space: IndexSpace,
    pub page_size: i64,
    /// K rows per chunk; 0 = automatic (min(32768, width·64 rounded up to 512)).
    pub supertile_tokens: i64,
    pub precision: Precision,
}

/// Validated capabilities. Equal caps give equal (interned) plans; the plan
/// is keyed by [`Caps::bucketed`], so the caps a plan reports are its
/// capacities, not necessarily what one caller asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Caps {
    pub device: Device,
    pub num_q_heads: u32,
    pub max_q_rows: u32,
    /// In pages of 64 compressed K rows.
    pub max_page_table_width: u32,
    pub topk: u32,
    pub mode: Mode,
    pub index_space: IndexSpace,
    pub page_size: u32,
    pub supertile_tokens: u32,
    pub precision: Precision,
}

fn invalid(operand: &'static str, expected: impl Into<Cow<'static, str>>, got: String) -> Error {
    Error::InvalidValue { op: OP, operand: operand.into(), expected: expected.into(), got }
}

fn in_range(operand: &'static str, v: i64, lo: u32, hi: u32) -> Result<u32> {
    if v >= lo as i64 && v <= hi as i64 {
        Ok(v as u32)
    } else {
        Err(invalid(operand, format!("an integer in [{lo}, {hi}]"), v.to_string()))
    }
}

/// Highest CUDA ordinal a plan may name (its home is [`crate::tensor`]).
pub use crate::tensor::MAX_CUDA_ORDINAL;

/// A caller's CUDA ordinal, checked before anything is built from it:
/// 0 ..= [`MAX_CUDA_ORDINAL`].
pub fn cuda_ordinal(ordinal: i64) -> Result<u32> {
    crate::tensor::cuda_ordinal(OP, ordinal)
}

/// The device rule of [`Caps::new`]: cpu, or cuda:N with N <= 127.
pub fn check_device(device: Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(i) => cuda_ordinal(i as i64).map(|_| ()),
        other => Err(Error::Device {
            op: OP,
            operand: "device".into(),
            expected: Device::Cuda(0),
            got: other,
        }),
    }
}

impl Caps {
    pub fn new(r: &CapsRequest) -> Result<Caps> {
        check_device(r.device)?;
        let num_q_heads = in_range("num_q_heads", r.num_q_heads, 1, MAX_HEADS)?;
        let max_q_rows = in_range("max_q_rows", r.max_q_rows, 1, MAX_Q_ROWS)?;
        let max_page_table_width =
            in_range("max_page_table_width", r.max_page_table_width, 1, MAX_PAGE_TABLE_WIDTH)?;
        if !SUPPORTED_TOPK.iter().any(|&k| k as i64 == r.topk) {
            return Err(invalid(
                "topk",
                "one of {512, 1024, 2048} (the sizes the selection kernels are built for)",
                r.topk.to_string(),
            ));
        }
        if r.page_size != PAGE_SIZE as i64 {
            return Err(invalid(
                "page_size",
                "64 (compressed K rows per FP8 cache page)",
                r.page_size.to_string(),
            ));
        }
        let s = r.supertile_tokens;
        let q = SUPERTILE_QUANTUM as i64;
        if s != 0 && (s < q || s > MAX_SUPERTILE as i64 || s % q != 0) {
            return Err(invalid(
                "supertile_tokens",
                format!("0 (automatic) or a multiple of {q} in [{q}, {MAX_SUPERTILE}]"),
                s.to_string(),
            ));
        }
        Ok(Caps {
            device: r.device,
            num_q_heads,
            max_q_rows,
            max_page_table_width,
            topk: r.topk as u32,
            mode: r.mode,
            index_space: r.index_space,
            page_size: PAGE_SIZE,
            supertile_tokens: s as u32,
            precision: r.precision,
        })
    }

    /// The plan key: rows and width rounded up to their buckets.
    pub fn bucketed(&self) -> Caps {
        Caps {
            max_q_rows: bucket(self.max_q_rows),
            max_page_table_width: bucket(self.max_page_table_width),
            ..*self
        }
    }
}

impl fmt::Display for Caps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "device={}, num_q_heads={}, max_q_rows={}, max_page_table_width={}, topk={}, \
             mode={}, output_index_space={}, page_size={}, supertile_tokens={}, precision={}",
            self.device,
            self.num_q_heads,
            self.max_q_rows,
            self.max_page_table_width,
            self.topk,
            self.mode.name(),
            self.index_space.name(),
            self.page_size,
            self.supertile_tokens,
            self.precision.name()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn request() -> CapsRequest {
        CapsRequest {
            device: Device::Cuda(0),
            num_q_heads: 64,
            max_q_rows: 16,
            max_page_table_width: 1024,
            topk: 512,
            mode: Mode::Decode,
            index_space: IndexSpace::Logical,
            page_size: 64,
            supertile_tokens: 0,
            precision: Precision::Exact,
        }
    }

    fn err(r: CapsRequest) -> String {
        Caps::new(&r).unwrap_err().to_string()
    }

    #[test]
    fn valid_request_keeps_its_values() {
        let c = Caps::new(&request()).unwrap();
        assert_eq!(
            (c.num_q_heads, c.max_q_rows, c.max_page_table_width, c.topk),
            (64, 16, 1024, 512)
        );
    }

    #[test]
    fn each_field_is_checked_with_a_precise_message() {
        assert_eq!(
            err(CapsRequest { num_q_heads: 65, ..request() }),
            "Caps: num_q_heads expected an integer in [1, 64], got 65"
        );
        assert_eq!(
            err(CapsRequest { max_q_rows: 0, ..request() }),
            "Caps: max_q_rows expected an integer in [1, 1048576], got 0"
        );
        assert!(err(CapsRequest { max_page_table_width: -3, ..request() })
            .contains("max_page_table_width expected an integer in [1, 16777216], got -3"));
        assert!(err(CapsRequest { topk: 4, ..request() })
            .starts_with("Caps: topk expected one of {512, 1024, 2048}"));
        assert!(err(CapsRequest { page_size: 32, ..request() }).contains("page_size expected 64"));
        assert!(err(CapsRequest { supertile_tokens: 1000, ..request() })
            .contains("supertile_tokens expected 0 (automatic) or a multiple of 512"));
        assert!(err(CapsRequest { device: Device::Other(8), ..request() })
            .contains("device expected device cuda:0"));
        assert_eq!(
            err(CapsRequest { device: Device::Cuda(300), ..request() }),
            "Caps: device expected a CUDA ordinal in [0, 127] (torch's device index is int8), \
             got 300"
        );
        assert!(Caps::new(&CapsRequest { device: Device::Cuda(127), ..request() }).is_ok());
        assert_eq!(cuda_ordinal(5).unwrap(), 5);
        assert!(cuda_ordinal(-1).unwrap_err().to_string().ends_with("got -1"));
        assert!(cuda_ordinal(1 << 40).is_err());
        assert_eq!(
            Mode::parse("chunked").unwrap_err().to_string(),
            "Caps: mode expected one of {decode, prefill}, got \"chunked\""
        );
        assert!(IndexSpace::parse("global").is_err());
    }

    #[test]
    fn bucketed_rounds_rows_and_width_only() {
        let c = Caps::new(&CapsRequest { max_q_rows: 9, max_page_table_width: 1025, ..request() })
            .unwrap();
        let b = c.bucketed();
        assert_eq!((b.max_q_rows, b.max_page_table_width), (10, 1280));
        assert_eq!(Caps { max_q_rows: 9, max_page_table_width: 1025, ..b }, c);
    }
}
