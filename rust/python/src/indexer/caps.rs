//! `Caps`: what a plan is made for, every field checked by b12x-core.

use std::hash::{DefaultHasher, Hash, Hasher};

use b12x_core::indexer::{Caps, CapsRequest, IndexSpace, Mode, Precision, PAGE_SIZE};
use b12x_core::{Device, Error as CoreError};
use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyString};

use super::torch_device;
use crate::device::{self, Need};
use crate::error::PyB12xResult;
use crate::tensor::short_repr;

fn caps_invalid(field: &'static str, expected: &'static str, got: String) -> CoreError {
    CoreError::InvalidValue { op: "Caps", operand: field.into(), expected: expected.into(), got }
}

/// The caps' device under b12x's one device grammar (a CUDA device must be
/// visible) and the torch.device it reports: the caller's own object when it
/// passed one (the adapters build caps per call), else a new one.
fn caps_device(obj: &Bound<'_, PyAny>) -> PyB12xResult<(Device, Py<PyAny>)> {
    let py = obj.py();
    let device = device::resolve("Caps", Some(obj), py, Need::Visible)?;
    let reusable = device::is_torch_device(obj)
        && !matches!(device, Device::Cuda(_) if device::index_of(obj).is_none());
    let reported = if reusable { obj.clone().unbind() } else { torch_device(py, device)? };
    Ok((device, reported))
}

struct IntArg {
    field: &'static str,
    value: i64,
    huge: Option<String>,
}

fn int_arg(field: &'static str, obj: &Bound<'_, PyAny>) -> PyB12xResult<IntArg> {
    let not_int = || caps_invalid(field, "an integer", short_repr(obj));
    if obj.is_instance_of::<PyBool>() {
        return Err(not_int().into());
    }
    match obj.extract::<i64>() {
        Ok(value) => Ok(IntArg { field, value, huge: None }),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
            let negative = obj.lt(0).unwrap_or(false);
            let value = if negative { i64::MIN } else { i64::MAX };
            Ok(IntArg { field, value, huge: Some(short_repr(obj)) })
        }
        Err(_) => Err(not_int().into()),
    }
}

fn str_arg(field: &'static str, obj: &Bound<'_, PyAny>) -> PyB12xResult<String> {
    match obj.cast::<PyString>() {
        Ok(s) => Ok(s.to_cow()?.into_owned()),
        Err(_) => Err(caps_invalid(field, "a string", short_repr(obj)).into()),
    }
}

/// A field's range error quotes the caller's own text for values past int64.
fn quote_huge(e: CoreError, args: &[IntArg]) -> CoreError {
    match e {
        CoreError::InvalidValue { op, operand, expected, got } => {
            let huge = args.iter().find(|a| a.field == operand).and_then(|a| a.huge.clone());
            CoreError::InvalidValue { op, operand, expected, got: huge.unwrap_or(got) }
        }
        other => other,
    }
}

/// What a plan is made for: device, query geometry, page-table capacity,
/// top-k, serving mode and output index space. Frozen, hashable,
/// keyword-only. Validated here, with one precise error per field.
///
/// Capacities are in query rows and in pages of 64 compressed K rows (C4:
/// one K row per four model tokens). ``topk`` must be 512, 1024 or 2048;
/// ``num_q_heads`` 1..64; ``mode`` "decode" (one page-table row per query
/// row) or "prefill" (one request's row shared by every query row);
/// ``output_index_space`` "logical" (request-relative position) or
/// "physical" (page_id*64 + slot); ``supertile_tokens`` 0 picks
/// min(32768, width*64 rounded up to 512) K rows per chunk.
///
/// Integer fields take ints (numpy integers too), never bools or floats; an
/// omitted or ``None`` optional field takes its default. ``device`` follows
/// b12x's one device grammar (``b12x.cuda.device_index``): a torch.device,
/// "cpu", "cuda" or ``None`` (the current CUDA device), "cuda:N" or an
/// ordinal N <= 127, and a CUDA device must be one this process can see.
/// Every refusal is a ``ConfigError`` naming the field, a ``DeviceError``
/// for the device.
///
/// ``precision`` "exact" (the default): fp32 accumulation of exact FP8
/// products, the same logits on every architecture. "fast": a device may use
/// a faster MMA with reduced-precision accumulation (Hopper: FP8 wgmma,
/// ``Plan.mma_flavor == "tma_fp8"``); every logit stays within 1e-3 of the
/// exact one relative to its magnitude, ``scale * sum_h |w_h| * |q_h . k|``
/// (1e-3 relative to the logit itself when no term is negative), and the
/// selected set equals the exact one's except for indices whose logit lies
/// within that tolerance of the k-th value. Where the hardware has no faster
/// path, "fast" runs the exact flavor.
#[pyclass(name = "Caps", module = "b12x.attention.dsa_indexer", frozen)]
pub struct PyCaps {
    pub(super) caps: Caps,
    /// The plan key (rows and width rounded up to their buckets).
    pub(super) key: Caps,
    pub(super) device: Py<PyAny>,
}

#[pymethods]
impl PyCaps {
    #[new]
    #[pyo3(signature = (*, device, num_q_heads, max_q_rows, max_page_table_width, topk,
        mode=None, output_index_space=None, page_size=None, supertile_tokens=None,
        precision=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        device: &Bound<'_, PyAny>,
        num_q_heads: &Bound<'_, PyAny>,
        max_q_rows: &Bound<'_, PyAny>,
        max_page_table_width: &Bound<'_, PyAny>,
        topk: &Bound<'_, PyAny>,
        mode: Option<&Bound<'_, PyAny>>,
        output_index_space: Option<&Bound<'_, PyAny>>,
        page_size: Option<&Bound<'_, PyAny>>,
        supertile_tokens: Option<&Bound<'_, PyAny>>,
        precision: Option<&Bound<'_, PyAny>>,
    ) -> PyB12xResult<Self> {
        let or = |arg: Option<&Bound<'_, PyAny>>, field, default| match arg {
            Some(obj) => int_arg(field, obj),
            None => Ok(IntArg { field, value: default, huge: None }),
        };
        let ints = [
            int_arg("num_q_heads", num_q_heads)?,
            int_arg("max_q_rows", max_q_rows)?,
            int_arg("max_page_table_width", max_page_table_width)?,
            int_arg("topk", topk)?,
            or(page_size, "page_size", PAGE_SIZE as i64)?,
            or(supertile_tokens, "supertile_tokens", 0)?,
        ];
        let mode = match mode {
            Some(m) => Mode::parse(&str_arg("mode", m)?)?,
            None => Mode::Decode,
        };
        let index_space = match output_index_space {
            Some(s) => IndexSpace::parse(&str_arg("output_index_space", s)?)?,
            None => IndexSpace::Logical,
        };
        let precision = match precision {
            Some(p) => Precision::parse(&str_arg("precision", p)?)?,
            None => Precision::Exact,
        };
        let (dev, device_obj) = caps_device(device)?;
        let [heads, rows, width, topk, page_size, supertile] = &ints;
        let caps = Caps::new(&CapsRequest {
            device: dev,
            num_q_heads: heads.value,
            max_q_rows: rows.value,
            max_page_table_width: width.value,
            topk: topk.value,
            mode,
            index_space,
            page_size: page_size.value,
            supertile_tokens: supertile.value,
            precision,
        })
        .map_err(|e| quote_huge(e, &ints))?;
        Ok(PyCaps { caps, key: caps.bucketed(), device: device_obj })
    }

    #[getter]
    fn device(&self, py: Python<'_>) -> Py<PyAny> {
        self.device.clone_ref(py)
    }
    #[getter]
    fn num_q_heads(&self) -> u32 {
        self.caps.num_q_heads
    }
    #[getter]
    fn max_q_rows(&self) -> u32 {
        self.caps.max_q_rows
    }
    #[getter]
    fn max_page_table_width(&self) -> u32 {
        self.caps.max_page_table_width
    }
    #[getter]
    fn topk(&self) -> u32 {
        self.caps.topk
    }
    #[getter]
    fn mode(&self) -> &'static str {
        self.caps.mode.name()
    }
    #[getter]
    fn output_index_space(&self) -> &'static str {
        self.caps.index_space.name()
    }
    #[getter]
    fn page_size(&self) -> u32 {
        self.caps.page_size
    }
    #[getter]
    fn supertile_tokens(&self) -> u32 {
        self.caps.supertile_tokens
    }
    #[getter]
    fn precision(&self) -> &'static str {
        self.caps.precision.name()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<PyCaps>().is_ok_and(|o| o.get().caps == self.caps)
    }

    fn __hash__(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.caps.hash(&mut h);
        h.finish()
    }

    fn __repr__(&self) -> String {
        format!("Caps({})", self.caps)
    }
}
