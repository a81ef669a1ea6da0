//! The all-reduce runtime of one rank (kernels/allreduce.cu).
//!
//! [`Runtime`] owns the rank's IPC slab, the host-mapped error word, the
//! peers' mapped slabs and the device table of their addresses. It is built
//! in steps so the caller can exchange handles and failure flags between
//! them: [`Runtime::allocate`] -> [`Runtime::handle`] (to every peer) ->
//! [`Runtime::open_peers`] (all or nothing) -> launches ->
//! [`Runtime::close_peers`] -> [`Runtime::free`]. Nothing is freed on drop
//! (see [`crate::ipc`]): the coordinated close frees.
//!
//! A launch takes a [`Launch`] that b12x-core's `bind_plain` / `bind_fused`
//! checked against this runtime's [`Target`].
//!
//! [`Runtime::host_stand_in`] replaces the device side only (slab, peers,
//! error word, kernel enqueue) by host memory and a launch counter, so that
//! `b12x bench host` and tests on machines without GPUs run the real
//! admission, bind and health read of every call.

use b12x_core::allreduce::knobs::MAX_TIMEOUT_S;
use b12x_core::allreduce::layout::check_world;
use b12x_core::allreduce::{Args, Float, Kernel as ArKernel, Launch, Limits, PacksPerThread};
use b12x_core::allreduce::{SlabLayout, Target};
use b12x_core::{Device, Error as CoreError};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::device::device_info;
use crate::error::{CudaError, Result};
use crate::ipc::{DeviceTable, HostWord, PeerMapping, Slab, IPC_HANDLE_BYTES};
use crate::kernel_args;
use crate::launch::{launch, LaunchConfig};
use crate::ptx::Kernel;

const OP: &str = "AllReduce";

/// `ArCtx` of kernels/allreduce.cuh: identical for every launch of a rank.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelCtx {
    /// Device table of every rank's slab base (as mapped in this process).
    pub peers: u64,
    /// Own slab base.
    pub own: u64,
    /// Device address of the host-mapped error word.
    pub host_err: u64,
    pub slot_bytes: u64,
    pub timeout_ns: u64,
    pub rank: u32,
    pub world: u32,
}

/// The PTX kernel of a plan's kernel choice.
pub const fn ptx_kernel(kernel: ArKernel) -> Kernel {
    use Float::{BF16, F16, F32};
    use PacksPerThread::{Four, One, Two};
    match kernel {
        ArKernel::OneShot(F16) => Kernel::ArOneShotF16,
        ArKernel::OneShot(BF16) => Kernel::ArOneShotBF16,
        ArKernel::OneShot(F32) => Kernel::ArOneShotF32,
        ArKernel::Fused(F16, One) => Kernel::ArFusedF16P1,
        ArKernel::Fused(F16, Two) => Kernel::ArFusedF16P2,
        ArKernel::Fused(F16, Four) => Kernel::ArFusedF16P4,
        ArKernel::Fused(BF16, One) => Kernel::ArFusedBF16P1,
        ArKernel::Fused(BF16, Two) => Kernel::ArFusedBF16P2,
        ArKernel::Fused(BF16, Four) => Kernel::ArFusedBF16P4,
        ArKernel::Fused(F32, One) => Kernel::ArFusedF32P1,
        ArKernel::Fused(F32, Two) => Kernel::ArFusedF32P2,
        ArKernel::Fused(F32, Four) => Kernel::ArFusedF32P4,
        ArKernel::TwoShotPull => Kernel::ArTwoShotBF16,
        ArKernel::TwoShotPush => Kernel::ArTwoShotPushBF16,
    }
}

fn invalid(operand: &'static str, expected: &'static str, got: String) -> CudaError {
    CoreError::InvalidValue { op: OP, operand: operand.into(), expected: expected.into(), got }
        .into()
}

fn not_open() -> CudaError {
    invalid("runtime", "an open runtime", "a closed or unopened one".into())
}

/// Keeps the first error of a sequence of clean-up steps that all must run.
fn first_error(errors: impl IntoIterator<Item = Result<()>>) -> Result<()> {
    let mut first = Ok(());
    for e in errors {
        if let (Ok(()), Err(e)) = (&first, e) {
            first = Err(e);
        }
    }
    first
}

/// The device side of [`Runtime::host_stand_in`]: an error word in host
/// memory (what kernels would write) and the launches it took.
#[derive(Debug)]
struct StandIn {
    device: Device,
    error: AtomicU32,
    launches: AtomicU64,
    health_reads: AtomicU64,
}

/// One rank's IPC all-reduce state.
#[derive(Debug)]
pub struct Runtime {
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
    stand_in: Option<StandIn>,
}

impl Runtime {
    /// Loads the kernels on `ordinal`, allocates and zeroes the slab (its
    /// slots hold whatever `limits` route with this two-shot transport) and
    /// the host error word. On failure nothing stays allocated.
    pub fn allocate(
        ordinal: u32,
        rank: u32,
        world: u32,
        limits: &Limits,
        twoshot_push: bool,
        timeout_ns: u64,
    ) -> Result<Runtime> {
        check_world(rank, world)?;
        if timeout_ns == 0 || timeout_ns as f64 > MAX_TIMEOUT_S * 1e9 {
            return Err(invalid(
                "timeout_ns",
                "1..=3.6e12 ns (at most an hour)",
                timeout_ns.to_string(),
            ));
        }
        let layout = SlabLayout::for_limits(limits, twoshot_push);
        let info = device_info(ordinal)?;
        let slab = Slab::allocate(ordinal, layout.total_bytes())?;
        let host = match HostWord::allocate(ordinal) {
            Ok(host) => host,
            Err(e) => {
                let _ = slab.free();
                return Err(e);
            }
        };
        Ok(Runtime {
            ordinal,
            rank,
            world,
            layout,
            timeout_ns,
            multiprocessors: info.multiprocessors,
            slab: Some(slab),
            host: Some(host),
            peers: Vec::new(),
            table: None,
            ctx: None,
            stand_in: None,
        })
    }

    /// A runtime whose device side is host memory: open at once (no slab, no
    /// peers), its operands on `device` (the host or a CUDA device), its
    /// launches counted instead of enqueued. Admission, bind and the health
    /// read are the real ones; for `b12x bench host` and GPU-less tests.
    pub fn host_stand_in(
        device: Device,
        rank: u32,
        world: u32,
        limits: &Limits,
        twoshot_push: bool,
        multiprocessors: u32,
    ) -> Result<Runtime> {
        check_world(rank, world)?;
        let layout = SlabLayout::for_limits(limits, twoshot_push);
        let timeout_ns = 1_000_000_000;
        Ok(Runtime {
            ordinal: match device {
                Device::Cuda(i) => i,
                _ => 0,
            },
            rank,
            world,
            layout,
            timeout_ns,
            multiprocessors,
            slab: None,
            host: None,
            peers: Vec::new(),
            table: None,
            ctx: Some(KernelCtx {
                peers: 0,
                own: 0,
                host_err: 0,
                slot_bytes: layout.slot_bytes,
                timeout_ns,
                rank,
                world,
            }),
            stand_in: Some(StandIn {
                device,
                error: AtomicU32::new(0),
                launches: AtomicU64::new(0),
                health_reads: AtomicU64::new(0),
            }),
        })
    }

    /// Launches a host stand-in took (None for a real runtime).
    pub fn stand_in_launches(&self) -> Option<u64> {
        self.stand_in.as_ref().map(|s| s.launches.load(Ordering::Relaxed))
    }

    /// Reads of a host stand-in's error word (None for a real runtime).
    pub fn stand_in_health_reads(&self) -> Option<u64> {
        self.stand_in.as_ref().map(|s| s.health_reads.load(Ordering::Relaxed))
    }

    /// Records `code` in a host stand-in's error word, as a kernel that timed
    /// out waiting for `code & 0xff` would; false for a real runtime.
    pub fn stand_in_record_error(&self, code: u32) -> bool {
        self.stand_in.as_ref().map(|s| s.error.store(code, Ordering::Relaxed)).is_some()
    }

    /// This rank's 64-byte CUipcMemHandle.
    pub fn handle(&self) -> Result<[u8; IPC_HANDLE_BYTES]> {
        Ok(self.slab.as_ref().ok_or_else(not_open)?.handle)
    }

    /// Opens every peer's slab from the handles of all ranks (in rank order;
    /// this rank's own entry is not opened) and uploads the slab table. All
    /// or nothing: on failure everything opened here is closed again.
    pub fn open_peers(&mut self, handles: &[Vec<u8>]) -> Result<()> {
        let slab = self.slab.as_ref().ok_or_else(not_open)?;
        let host = self.host.as_ref().ok_or_else(not_open)?;
        if handles.len() != self.world as usize || self.ctx.is_some() {
            return Err(invalid(
                "handles",
                "one handle per rank, once",
                format!("{} handles", handles.len()),
            ));
        }
        let mut bases = vec![0u64; self.world as usize];
        let mut opened: Vec<PeerMapping> = Vec::new();
        let result = (|| -> Result<DeviceTable> {
            for (r, h) in handles.iter().enumerate() {
                if r == self.rank as usize {
                    bases[r] = slab.ptr;
                    continue;
                }
                let h: &[u8; IPC_HANDLE_BYTES] = h.as_slice().try_into().map_err(|_| {
                    invalid(
                        "handles",
                        "64-byte handles",
                        format!("{} bytes from rank {r}", h.len()),
                    )
                })?;
                let m = PeerMapping::open(self.ordinal, h)?;
                bases[r] = m.ptr;
                opened.push(m);
            }
            DeviceTable::upload(self.ordinal, &bases)
        })();
        match result {
            Ok(table) => {
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

    /// Closes the peers' mappings and frees the table (call after a device
    /// sync and a group barrier). Idempotent; every step runs, the first
    /// error is returned.
    pub fn close_peers(&mut self) -> Result<()> {
        self.ctx = None;
        let peers = self.peers.drain(..).map(PeerMapping::close).collect::<Vec<_>>();
        let table = self.table.take().map(DeviceTable::free);
        first_error(peers.into_iter().chain(table))
    }

    /// Frees the own slab and host word (after every peer closed its
    /// mapping of this slab). Idempotent. If this rank's own mappings fail to
    /// close, its memory stays allocated (quarantined) and the error returns.
    pub fn free(&mut self) -> Result<()> {
        self.close_peers()?;
        let slab = self.slab.take().map(Slab::free);
        let host = self.host.take().map(HostWord::free);
        first_error(slab.into_iter().chain(host))
    }

    /// The error code kernels recorded (0 = none); read without a device sync.
    pub fn error_code(&self) -> u32 {
        match &self.stand_in {
            Some(s) => {
                s.health_reads.fetch_add(1, Ordering::Relaxed);
                s.error.load(Ordering::Relaxed)
            }
            None => self.host.as_ref().map_or(0, HostWord::read),
        }
    }

    /// `CollectiveTimeout` if a kernel recorded a timeout.
    pub fn check(&self) -> Result<()> {
        match self.error_code() {
            0 => Ok(()),
            code => Err(CudaError::CollectiveTimeout {
                rank: self.rank,
                peer: code & 0xff,
                code,
                timeout_ns: self.timeout_ns,
            }),
        }
    }

    /// What a launch is checked against; None until the peers are open.
    pub fn target(&self) -> Option<Target> {
        self.ctx.map(|_| Target {
            device: self.stand_in.as_ref().map_or(Device::Cuda(self.ordinal), |s| s.device),
            world: self.world,
            slot_bytes: self.layout.slot_bytes,
        })
    }

    pub fn is_open(&self) -> bool {
        self.ctx.is_some()
    }
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }
    pub fn rank(&self) -> u32 {
        self.rank
    }
    pub fn world(&self) -> u32 {
        self.world
    }
    pub fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }
    pub fn layout(&self) -> SlabLayout {
        self.layout
    }

    /// Enqueues `launch` on `stream` (a CUstream of this runtime's device).
    /// Refuses a runtime that is not open or recorded a timeout (nothing is
    /// launched after a peer failed), and a launch bound for another target.
    ///
    /// # Safety
    /// The tensors `launch` was bound from are alive, and their metadata
    /// describes their memory, until the kernel has run; every rank launches
    /// the same plan in the same order on its runtime (the declared plans
    /// give every rank the same kernel and geometry).
    pub unsafe fn launch(&self, launch: &Launch, stream: u64) -> Result<()> {
        let ctx = self.ctx.ok_or_else(not_open)?;
        self.check()?;
        if self.target() != Some(launch.target) {
            return Err(invalid(
                "launch",
                "a launch bound for this runtime",
                format!("{:?}", launch.target),
            ));
        }
        if let Some(s) = &self.stand_in {
            s.launches.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let kernel = ptx_kernel(launch.kernel);
        let config = LaunchConfig::linear(launch.geometry.grid, launch.geometry.block);
        match launch.args {
            Args::Plain(a) => {
                let mut args = kernel_args![ctx, a.inp, a.out, a.packs];
                // SAFETY: args match (ArCtx, const T*, T*, u64); bind checked the operands
                // against the plan and this runtime (device, dtype, size, alignment, the
                // slot holds the staged bytes); liveness is the caller's contract.
                unsafe { launch_on(self.ordinal, kernel, config, stream, &mut args) }
            }
            Args::Fused(a) => {
                let mut args = kernel_args![
                    ctx,
                    a.inp,
                    a.residual,
                    a.weight,
                    a.out,
                    a.residual_out,
                    a.rows,
                    a.row_packs,
                    a.hidden,
                    a.eps
                ];
                // SAFETY: args match the fused kernel's parameter list; as above.
                unsafe { launch_on(self.ordinal, kernel, config, stream, &mut args) }
            }
        }
    }
}

/// # Safety
/// As [`launch`].
unsafe fn launch_on(
    ordinal: u32,
    kernel: Kernel,
    config: LaunchConfig,
    stream: u64,
    args: &mut [*mut std::ffi::c_void],
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { launch(ordinal, kernel, config, stream, args) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctx_layout_matches_the_kernel_struct() {
        // ArCtx: five u64 then two u32, 8-byte aligned, 48 bytes.
        assert_eq!(std::mem::size_of::<KernelCtx>(), 48);
        assert_eq!(std::mem::align_of::<KernelCtx>(), 8);
    }

    /// Every kernel a plan can choose exists in the all-reduce module, with
    /// the dtype and packs per thread its symbol names.
    #[test]
    fn every_kernel_choice_has_its_ptx_kernel() {
        let module = crate::ptx::MODULES.iter().find(|m| m.name == "allreduce").unwrap();
        let mut seen = std::collections::HashSet::new();
        for choice in ArKernel::all() {
            let k = ptx_kernel(choice);
            assert!(module.kernels.contains(&k), "{choice:?}");
            assert!(seen.insert(k), "{choice:?} maps to a kernel twice");
            let symbol = k.symbol();
            let expected = match choice {
                ArKernel::OneShot(f) => format!("oneshot_{}", short(f)),
                ArKernel::Fused(f, p) => format!("fused_{}_p{}", short(f), p.count()),
                ArKernel::TwoShotPull => "twoshot_bf16".into(),
                ArKernel::TwoShotPush => "twoshot_push_bf16".into(),
            };
            assert_eq!(symbol, format!("b12x_allreduce_{expected}"));
        }
        assert_eq!(seen.len(), module.kernels.len());
    }

    fn short(f: Float) -> &'static str {
        match f {
            Float::F16 => "f16",
            Float::BF16 => "bf16",
            Float::F32 => "f32",
        }
    }

    #[test]
    fn clean_up_keeps_the_first_error_and_runs_every_step() {
        let mut ran = 0;
        let steps = (0..3).map(|i| {
            ran += 1;
            if i == 0 {
                Ok(())
            } else {
                Err(CudaError::NotLoaded(i))
            }
        });
        let e = first_error(steps.collect::<Vec<_>>());
        assert!(matches!(e, Err(CudaError::NotLoaded(1))));
        assert_eq!(ran, 3);
        assert!(first_error([]).is_ok());
    }
}
