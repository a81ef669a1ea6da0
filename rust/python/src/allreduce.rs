//! Bindings of the IPC all-reduce: routing and byte-size parsing (pure, from
//! b12x-core), prepared plans, and one rank's IPC runtime (b12x-cuda).

use b12x_core::allreduce::{
    self as ar, fused_geometry, oneshot_geometry, twoshot_geometry, Declared, Geometry, Limits,
    Route, SlabLayout,
};
use b12x_core::collective::Operation;
use b12x_core::tensor::{is_dense, is_row_major};
use b12x_core::validate::Operand;
use b12x_core::{DType, Device, Error as CoreError, TensorMeta};
use b12x_cuda::allreduce::{self as launch, FusedArgs, KernelCtx, PlainArgs};
use b12x_cuda::ipc::{DeviceTable, HostWord, PeerMapping, Slab, IPC_HANDLE_BYTES};
use b12x_cuda::{device_info, Kernel};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::error::{exc, PyB12xResult};
use crate::tensor::extract;

const FLOATS: [DType; 3] = [DType::F16, DType::BF16, DType::F32];

fn dtype_from_name(op: &'static str, name: &str) -> Result<DType, CoreError> {
    let name = name.strip_prefix("torch.").unwrap_or(name);
    FLOATS.into_iter().find(|d| d.name() == name).ok_or_else(|| CoreError::InvalidValue {
        op,
        operand: "dtype".into(),
        expected: "one of float16, bfloat16, float32".into(),
        got: name.to_string(),
    })
}

fn invalid(
    op: &'static str,
    operand: &'static str,
    expected: &'static str,
    got: String,
) -> CoreError {
    CoreError::InvalidValue { op, operand: operand.into(), expected: expected.into(), got }
}

/// Parses a byte size ("17", "84KB", "6 MiB", "2g"); signed.
#[pyfunction]
fn allreduce_parse_byte_size(text: &str) -> PyB12xResult<i64> {
    Ok(ar::parse_byte_size(text)?)
}

/// A byte-size limit where "", "0", "off", "none" and "disabled" mean 0.
#[pyfunction]
fn allreduce_parse_optional_byte_size(text: &str) -> PyB12xResult<u64> {
    Ok(ar::parse_optional_byte_size(text)?)
}

/// Routes a declaration: ("oneshot" | "oneshot_fused" | "twoshot", "") or (None, why).
#[pyfunction]
#[pyo3(signature = (operation, shape, dtype, strides, world, limits))]
fn allreduce_route(
    operation: &str,
    shape: Vec<i64>,
    dtype: &str,
    strides: Option<Vec<i64>>,
    world: u32,
    limits: (u64, u64, u64, u64),
) -> PyB12xResult<(Option<&'static str>, String)> {
    const OP: &str = "AllReduce.declare";
    let op = Operation::parse(operation).ok_or_else(|| {
        invalid(OP, "operation", "all_reduce or all_reduce_fused_add_rms_norm", operation.into())
    })?;
    let dtype = match dtype_from_name(OP, dtype) {
        Ok(d) => d,
        Err(e) => return Ok((None, e.to_string())),
    };
    let limits = Limits::new(limits.0, limits.1, limits.2, limits.3)?;
    let decl = Declared { operation: op, shape: &shape, dtype, strides: strides.as_deref() };
    Ok(match ar::route(&decl, world, &limits) {
        Ok(route) => (Some(route.name()), String::new()),
        Err(why) => (None, why.0),
    })
}

/// A prepared all-reduce: kernel and launch geometry for one declared
/// (route, shape, dtype). Equal declarations share one plan.
#[pyclass(name = "AllReducePlan", module = "b12x._core", frozen)]
#[derive(Debug)]
pub struct PyAllReducePlan {
    route: Route,
    dtype: DType,
    shape: Vec<i64>,
    numel: u64,
    rows: u32,
    hidden: u32,
    world: u32,
    geometry: Geometry,
    kernel: Kernel,
}

#[pymethods]
impl PyAllReducePlan {
    #[new]
    #[pyo3(signature = (route, shape, dtype, world, multiprocessors, twoshot_push = false))]
    fn new(
        route: &str,
        shape: Vec<i64>,
        dtype: &str,
        world: u32,
        multiprocessors: u32,
        twoshot_push: bool,
    ) -> PyB12xResult<Self> {
        const OP: &str = "AllReducePlan";
        let dtype = dtype_from_name(OP, dtype)?;
        if shape.iter().any(|&d| d <= 0) {
            return Err(invalid(OP, "shape", "positive extents", format!("{shape:?}")).into());
        }
        let numel: u64 = shape.iter().map(|&d| d as u64).product();
        let nbytes = numel * dtype.itemsize();
        if nbytes % 16 != 0 {
            return Err(
                invalid(OP, "shape", "a multiple of 16 bytes", format!("{nbytes} bytes")).into()
            );
        }
        let packs = nbytes / 16;
        let (route, geometry, kernel, rows, hidden) = match route {
            "oneshot" => {
                let g = oneshot_geometry(packs, multiprocessors);
                (Route::OneShot, g, launch::oneshot_kernel(dtype), 0, 0)
            }
            "twoshot" => {
                let g = twoshot_geometry(packs, world, multiprocessors);
                (Route::TwoShot, g, launch::twoshot_kernel(dtype, twoshot_push), 0, 0)
            }
            "oneshot_fused" => {
                let hidden = *shape.last().unwrap_or(&0) as u64;
                let rows = numel / hidden.max(1);
                let row_packs = hidden * dtype.itemsize() / 16;
                let g = u32::try_from(row_packs)
                    .ok()
                    .filter(|_| rows <= u32::MAX as u64 && hidden <= u32::MAX as u64)
                    .and_then(|rp| fused_geometry(rows, rp, multiprocessors))
                    .ok_or_else(|| {
                        invalid(OP, "shape", "rows of at most 64 KiB", format!("{shape:?}"))
                    })?;
                (
                    Route::Fused,
                    g,
                    launch::fused_kernel(dtype, g.packs_per_thread),
                    rows as u32,
                    hidden as u32,
                )
            }
            other => {
                return Err(
                    invalid(OP, "route", "oneshot, oneshot_fused or twoshot", other.into()).into()
                )
            }
        };
        let kernel = kernel.ok_or_else(|| {
            invalid(OP, "dtype", "a dtype this route supports", dtype.name().into())
        })?;
        Ok(PyAllReducePlan { route, dtype, shape, numel, rows, hidden, world, geometry, kernel })
    }

    #[getter]
    fn route(&self) -> &'static str {
        self.route.name()
    }
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }
    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.shape.clone()
    }
    #[getter]
    fn nbytes(&self) -> u64 {
        self.numel * self.dtype.itemsize()
    }
    /// (grid, block, packs per thread)
    #[getter]
    fn geometry(&self) -> (u32, u32, u32) {
        (self.geometry.grid, self.geometry.block, self.geometry.packs_per_thread)
    }
    #[getter]
    fn kernel(&self) -> &'static str {
        self.kernel.symbol()
    }
    #[getter]
    fn twoshot_push(&self) -> bool {
        self.kernel == Kernel::ArTwoShotPushBF16
    }

    fn __repr__(&self) -> String {
        format!(
            "AllReducePlan(route={}, shape={:?}, dtype={}, grid={}, block={}, kernel={})",
            self.route.name(),
            self.shape,
            self.dtype.name(),
            self.geometry.grid,
            self.geometry.block,
            self.kernel.symbol()
        )
    }
}

/// One rank's IPC all-reduce state: own slab, host error word, peers' mapped
/// slabs and the device table of slab addresses. Built in steps so Python can
/// exchange handles and failure flags between them; nothing is freed on drop
/// (see b12x_cuda::ipc).
#[pyclass(name = "IpcAllReduce", module = "b12x._core")]
pub struct PyIpcAllReduce {
    ordinal: u32,
    rank: u32,
    world: u32,
    layout: SlabLayout,
    timeout_ns: u64,
    multiprocessors: u32,
    slab: Option<Slab>,
    host: Option<HostWord>,
    peers: Vec<PeerMapping>,
    table: Option<DeviceTable>,
    ctx: Option<KernelCtx>,
}

const RUN: &str = "AllReduce";

fn not_open() -> CoreError {
    invalid(RUN, "runtime", "an open runtime", "a closed or unopened one".into())
}

/// Flat (dense) or row-major operand of `plan`, on `ordinal`, 16-byte aligned.
fn check_operand(
    plan: &PyAllReducePlan,
    ordinal: u32,
    name: &'static str,
    meta: &TensorMeta,
) -> PyB12xResult<()> {
    let o = Operand::new(RUN, name, meta);
    o.dtype(&[plan.dtype])?.device(Device::Cuda(ordinal))?.aligned(16)?;
    if meta.numel() != plan.numel {
        return Err(o.shape_error(format!("{:?} ({} elements)", plan.shape, plan.numel)).into());
    }
    let dense = match plan.route {
        Route::OneShot => is_dense(&meta.shape, &meta.strides),
        Route::TwoShot | Route::Fused => is_row_major(&meta.shape, &meta.strides),
    };
    if !dense {
        let what = if plan.route == Route::OneShot { "dense" } else { "row-major contiguous" };
        return Err(o.layout_error(what).into());
    }
    Ok(())
}

fn same_layout(a: &TensorMeta, b: &TensorMeta, name: &'static str) -> PyB12xResult<()> {
    let norm = |m: &TensorMeta| -> Vec<(i64, i64)> {
        m.shape.iter().zip(&m.strides).map(|(&d, &s)| (d, if d == 1 { 0 } else { s })).collect()
    };
    if norm(a) != norm(b) {
        return Err(Operand::new(RUN, name, b).layout_error("the input's shape and").into());
    }
    Ok(())
}

impl PyIpcAllReduce {
    fn ready(&self) -> PyB12xResult<&KernelCtx> {
        let ctx = self.ctx.as_ref().ok_or_else(not_open)?;
        if let Some(host) = &self.host {
            let code = host.read();
            if code != 0 {
                return Err(timeout_error(self.rank, code, self.timeout_ns).into());
            }
        }
        Ok(ctx)
    }
}

fn timeout_error(rank: u32, code: u32, timeout_ns: u64) -> PyErr {
    let peer = code & 0xff;
    exc::CollectiveTimeoutError::new_err(format!(
        "AllReduce: rank {rank} waited more than {:.3} s for rank {peer} at a barrier \
         (error code {code:#x}); the peer is dead or far behind. The runtime is unusable: \
         close it and fall back to NCCL",
        timeout_ns as f64 * 1e-9
    ))
}

#[pymethods]
impl PyIpcAllReduce {
    /// Loads the kernels, allocates and zeroes the slab (slots of `slot_bytes`)
    /// and the host error word on `ordinal`.
    #[new]
    fn new(
        py: Python<'_>,
        ordinal: u32,
        rank: u32,
        world: u32,
        slot_bytes: u64,
        timeout_ns: u64,
    ) -> PyB12xResult<Self> {
        const OP: &str = "IpcAllReduce";
        if !(2..=ar::layout::MAX_WORLD).contains(&world) || rank >= world {
            return Err(invalid(
                OP,
                "world",
                "2..=8 ranks and rank < world",
                format!("rank {rank} of {world}"),
            )
            .into());
        }
        let layout = SlabLayout::for_max_bytes(slot_bytes).ok_or_else(|| {
            invalid(OP, "slot_bytes", "a slot size below 2^62", slot_bytes.to_string())
        })?;
        let (slab, host, multiprocessors) = py.detach(|| -> b12x_cuda::Result<_> {
            let info = device_info(ordinal)?;
            let slab = Slab::allocate(ordinal, layout.total_bytes())?;
            match HostWord::allocate(ordinal) {
                Ok(host) => Ok((slab, host, info.multiprocessors)),
                Err(e) => {
                    let _ = slab.free();
                    Err(e)
                }
            }
        })?;
        Ok(PyIpcAllReduce {
            ordinal,
            rank,
            world,
            layout,
            timeout_ns,
            multiprocessors,
            slab: Some(slab),
            host: Some(host),
            peers: Vec::new(),
            table: None,
            ctx: None,
        })
    }

    /// This rank's 64-byte CUipcMemHandle.
    fn handle<'py>(&self, py: Python<'py>) -> PyB12xResult<Bound<'py, PyBytes>> {
        let slab = self.slab.as_ref().ok_or_else(not_open)?;
        Ok(PyBytes::new(py, &slab.handle))
    }

    /// Opens every peer's slab from the gathered handles (in rank order; this
    /// rank's own entry is not opened) and uploads the slab table. On failure
    /// everything opened here is closed again.
    fn open_peers(&mut self, handles: Vec<Vec<u8>>) -> PyB12xResult<()> {
        const OP: &str = "IpcAllReduce.open_peers";
        let slab = self.slab.as_ref().ok_or_else(not_open)?;
        if handles.len() != self.world as usize || self.ctx.is_some() {
            return Err(invalid(
                OP,
                "handles",
                "one handle per rank, once",
                format!("{} handles", handles.len()),
            )
            .into());
        }
        let mut bases = vec![0u64; self.world as usize];
        let mut opened: Vec<PeerMapping> = Vec::new();
        let result = (|| -> PyB12xResult<DeviceTable> {
            for (r, h) in handles.iter().enumerate() {
                if r == self.rank as usize {
                    bases[r] = slab.ptr;
                    continue;
                }
                let h: &[u8; IPC_HANDLE_BYTES] = h.as_slice().try_into().map_err(|_| {
                    invalid(
                        OP,
                        "handles",
                        "64-byte handles",
                        format!("{} bytes from rank {r}", h.len()),
                    )
                })?;
                let m = PeerMapping::open(self.ordinal, h)?;
                bases[r] = m.ptr;
                opened.push(m);
            }
            Ok(DeviceTable::upload(self.ordinal, &bases)?)
        })();
        match result {
            Ok(table) => {
                let host = self.host.as_ref().ok_or_else(not_open)?;
                self.ctx = Some(KernelCtx {
                    peers: table.ptr,
                    own: slab.ptr,
                    host_err: host.device_ptr,
                    slot_bytes: self.layout.slot_bytes,
                    timeout_ns: self.timeout_ns,
                    rank: self.rank,
                    world: self.world,
                });
                self.table = Some(table);
                self.peers = opened;
                Ok(())
            }
            Err(e) => {
                for m in opened {
                    let _ = m.close();
                }
                Err(e)
            }
        }
    }

    /// Closes the peers' mappings and frees the table (call after a device sync
    /// and a group barrier). Idempotent.
    fn close_peers(&mut self) -> PyB12xResult<()> {
        self.ctx = None;
        let mut first_err = None;
        for m in self.peers.drain(..) {
            if let Err(e) = m.close() {
                first_err.get_or_insert(e);
            }
        }
        if let Some(t) = self.table.take() {
            if let Err(e) = t.free() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Frees the own slab and host word (after every peer closed its mapping). Idempotent.
    fn free(&mut self) -> PyB12xResult<()> {
        self.close_peers()?;
        let mut first_err = None;
        if let Some(s) = self.slab.take() {
            if let Err(e) = s.free() {
                first_err.get_or_insert(e);
            }
        }
        if let Some(h) = self.host.take() {
            if let Err(e) = h.free() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// The error code kernels recorded (0 = none); read without a device sync.
    fn error_code(&self) -> u32 {
        self.host.as_ref().map_or(0, HostWord::read)
    }

    /// Raises CollectiveTimeoutError if a kernel recorded a timeout.
    fn check(&self) -> PyResult<()> {
        let code = self.error_code();
        if code != 0 {
            return Err(timeout_error(self.rank, code, self.timeout_ns));
        }
        Ok(())
    }

    #[getter]
    fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }
    #[getter]
    fn slab_bytes(&self) -> u64 {
        self.layout.total_bytes()
    }
    #[getter]
    fn slot_bytes(&self) -> u64 {
        self.layout.slot_bytes
    }
    #[getter]
    fn is_open(&self) -> bool {
        self.ctx.is_some()
    }

    /// One-shot or two-shot all-reduce of `inp` into `out` on `stream`.
    fn run(
        &self,
        plan: &Bound<'_, PyAllReducePlan>,
        inp: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        stream: u64,
    ) -> PyB12xResult<()> {
        let plan = plan.get();
        let ctx = self.ready()?;
        if plan.route == Route::Fused {
            return Err(
                invalid(RUN, "plan", "a one-shot or two-shot plan", "a fused plan".into()).into()
            );
        }
        let i = extract(inp, RUN, "inp")?;
        let o = extract(out, RUN, "out")?;
        check_operand(plan, self.ordinal, "inp", &i)?;
        check_operand(plan, self.ordinal, "out", &o)?;
        same_layout(&i, &o, "out")?;
        let nbytes = plan.numel * plan.dtype.itemsize();
        // the push two-shot stages 2 * world regions of the largest shard
        let staged = match plan.kernel {
            Kernel::ArTwoShotPushBF16 => {
                (nbytes / 16).div_ceil(self.world as u64) * self.world as u64 * 32
            }
            _ => nbytes,
        };
        if staged > self.layout.slot_bytes || plan.world != self.world {
            return Err(CoreError::Capacity {
                op: RUN,
                operand: "inp".into(),
                limit: self.layout.slot_bytes,
                got: staged,
                hint: format!(
                    "staged bytes (plan for world {}, runtime world {}); declare through this \
                     runtime, whose limits size its slots",
                    plan.world, self.world
                )
                .into(),
            }
            .into());
        }
        let args = PlainArgs { inp: i.address(), out: o.address(), packs: nbytes / 16 };
        // SAFETY: the runtime is open (ctx), both operands were checked to be
        // 16-byte aligned dense tensors of `nbytes` on this device, the slot holds
        // nbytes, and the declared plan gives every rank the same kernel/geometry.
        unsafe { launch::plain(self.ordinal, plan.kernel, ctx, plan.geometry, &args, stream)? };
        Ok(())
    }

    /// Fused all-reduce + residual add + RMSNorm on `stream`. `out` may be
    /// `inp` and `residual_out` may be `residual`; `out` may not alias `residual_out`.
    #[allow(clippy::too_many_arguments)]
    fn run_fused(
        &self,
        plan: &Bound<'_, PyAllReducePlan>,
        inp: &Bound<'_, PyAny>,
        residual: &Bound<'_, PyAny>,
        weight: &Bound<'_, PyAny>,
        eps: f64,
        out: &Bound<'_, PyAny>,
        residual_out: &Bound<'_, PyAny>,
        stream: u64,
    ) -> PyB12xResult<()> {
        let plan = plan.get();
        let ctx = self.ready()?;
        if plan.route != Route::Fused || plan.world != self.world {
            return Err(invalid(
                RUN,
                "plan",
                "a fused plan of this world size",
                format!("{plan:?}"),
            )
            .into());
        }
        let metas = [
            ("inp", extract(inp, RUN, "inp")?),
            ("residual", extract(residual, RUN, "residual")?),
            ("out", extract(out, RUN, "out")?),
            ("residual_out", extract(residual_out, RUN, "residual_out")?),
        ];
        for (name, m) in &metas {
            check_operand(plan, self.ordinal, name, m)?;
        }
        let w = extract(weight, RUN, "weight")?;
        Operand::new(RUN, "weight", &w)
            .dtype(&[plan.dtype])?
            .device(Device::Cuda(self.ordinal))?
            .shape(&[Some(plan.hidden as i64)])?
            .contiguous()?
            .aligned(16)?;
        let [i, r, o, ro] = metas.map(|(_, m)| m.address());
        if o == ro {
            return Err(invalid(
                RUN,
                "out",
                "a buffer distinct from residual_out",
                format!("{o:#x}"),
            )
            .into());
        }
        if eps.is_nan() || eps < 0.0 {
            return Err(invalid(RUN, "eps", "a non-negative epsilon", eps.to_string()).into());
        }
        let row_packs = (plan.hidden as u64 * plan.dtype.itemsize() / 16) as u32;
        let args = FusedArgs {
            inp: i,
            residual: r,
            weight: w.address(),
            out: o,
            residual_out: ro,
            rows: plan.rows,
            row_packs,
            hidden: plan.hidden,
            eps: eps as f32,
        };
        // SAFETY: as `run`, for the four row-major operands and the weight row.
        unsafe { launch::fused(self.ordinal, plan.kernel, ctx, plan.geometry, &args, stream)? };
        Ok(())
    }
}

/// PCI bus id of `ordinal` (names a GPU across processes).
#[pyfunction]
fn pci_bus_id(ordinal: u32) -> PyB12xResult<String> {
    Ok(b12x_cuda::pci_bus_id(ordinal)?)
}

/// Native P2P atomics both ways between `ordinal` and the GPU at `peer_bus_id`
/// (NVLink yes, PCIe no); None if that GPU is not visible here.
#[pyfunction]
fn p2p_native_atomics(ordinal: u32, peer_bus_id: &str) -> PyB12xResult<Option<bool>> {
    Ok(b12x_cuda::p2p_native_atomics(ordinal, peer_bus_id)?)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pci_bus_id, m)?)?;
    m.add_function(wrap_pyfunction!(p2p_native_atomics, m)?)?;
    m.add_function(wrap_pyfunction!(allreduce_parse_byte_size, m)?)?;
    m.add_function(wrap_pyfunction!(allreduce_parse_optional_byte_size, m)?)?;
    m.add_function(wrap_pyfunction!(allreduce_route, m)?)?;
    m.add_class::<PyAllReducePlan>()?;
    m.add_class::<PyIpcAllReduce>()?;
    Ok(())
}
