//! `bind`: one call's live tensors checked against a plan and the runtime
//! that runs it, reduced to the plain values a launch needs ([`Launch`]).
//!
//! Like the indexer's bind it reads metadata only. The same checks decide
//! admission ([`admit_plain`], [`admit_fused`]): a call the adapter admits
//! is one its launch accepts.

use std::borrow::Cow;

use crate::error::{Error, Result};
use crate::tensor::{is_dense, is_row_major, Device, TensorMeta};
use crate::validate::Operand;

use super::geometry::Geometry;
use super::plan::{Kernel, Plan};
use super::route::Route;

const OP: &str = "AllReduce";
/// Every kernel moves 16-byte packs.
const ALIGN: u64 = 16;

/// What one rank's open runtime offers a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// Where the runtime's operands live: its CUDA device (or the host, for
    /// the runtime's host stand-in).
    pub device: Device,
    pub world: u32,
    /// Bytes of one staging slot.
    pub slot_bytes: u64,
}

/// Live operands of the one-shot and two-shot kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlainArgs {
    pub inp: u64,
    pub out: u64,
    /// 16-byte packs of `inp` (and `out`).
    pub packs: u64,
}

/// Live operands of the fused kernel: `rows x hidden` row-major tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusedArgs {
    pub inp: u64,
    pub residual: u64,
    pub weight: u64,
    pub out: u64,
    pub residual_out: u64,
    pub rows: u32,
    pub row_packs: u32,
    pub hidden: u32,
    pub eps: f32,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Args {
    Plain(PlainArgs),
    Fused(FusedArgs),
}

/// One checked launch: the plan's kernel and geometry, the operands, and the
/// runtime it was checked against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Launch {
    pub kernel: Kernel,
    pub geometry: Geometry,
    pub target: Target,
    pub args: Args,
}

/// The operands of a fused call. `out` may be `inp` and `residual_out` may be
/// `residual`; `out` may not alias `residual_out`.
#[derive(Debug, Clone, Copy)]
pub struct FusedOperands<'a> {
    pub inp: &'a TensorMeta,
    pub residual: &'a TensorMeta,
    pub weight: &'a TensorMeta,
    pub out: &'a TensorMeta,
    pub residual_out: &'a TensorMeta,
}

fn invalid(operand: &'static str, expected: impl Into<Cow<'static, str>>, got: String) -> Error {
    Error::InvalidValue { op: OP, operand: operand.into(), expected: expected.into(), got }
}

/// An operand of `plan`: its dtype, on the runtime's device, 16-byte
/// aligned, `plan.numel()` elements, dense (one-shot: any dimension order)
/// or row-major (two-shot, fused).
fn operand(plan: &Plan, target: &Target, name: &'static str, meta: &TensorMeta) -> Result<()> {
    let o = Operand::new(OP, name, meta);
    o.dtype(&[plan.dtype()])?.device(target.device)?.aligned(ALIGN)?;
    if meta.numel() != plan.numel() {
        return Err(o.shape_error(format!("{:?} ({} elements)", plan.shape(), plan.numel())));
    }
    let (ok, what) = match plan.route() {
        Route::OneShot => (is_dense(&meta.shape, &meta.strides), "dense"),
        Route::TwoShot | Route::Fused => {
            (is_row_major(&meta.shape, &meta.strides), "row-major contiguous")
        }
    };
    if !ok {
        return Err(o.layout_error(what));
    }
    Ok(())
}

/// `b` has `a`'s shape and element order (size-1 strides aside).
fn same_layout(a: &TensorMeta, b: &TensorMeta, name: &'static str) -> Result<()> {
    let norm = |m: &TensorMeta| -> Vec<(i64, i64)> {
        m.shape.iter().zip(&m.strides).map(|(&d, &s)| (d, if d == 1 { 0 } else { s })).collect()
    };
    if norm(a) != norm(b) {
        return Err(Operand::new(OP, name, b).layout_error("the input's shape and"));
    }
    Ok(())
}

/// A plain (one-shot or two-shot) launch of `plan` from `inp` into `out`.
pub fn bind_plain(
    plan: &Plan,
    target: &Target,
    inp: &TensorMeta,
    out: &TensorMeta,
) -> Result<Launch> {
    if plan.route() == Route::Fused {
        return Err(invalid("plan", "a one-shot or two-shot plan", "a fused plan".into()));
    }
    operand(plan, target, "inp", inp)?;
    operand(plan, target, "out", out)?;
    same_layout(inp, out, "out")?;
    if plan.staged_bytes() > target.slot_bytes || plan.world() != target.world {
        return Err(Error::Capacity {
            op: OP,
            operand: "inp".into(),
            limit: target.slot_bytes,
            got: plan.staged_bytes(),
            hint: format!(
                "staged bytes (plan for world {}, runtime world {}); declare through this \
                 runtime, whose limits size its slots",
                plan.world(),
                target.world
            )
            .into(),
        });
    }
    let args = PlainArgs { inp: inp.address(), out: out.address(), packs: plan.nbytes() / 16 };
    Ok(Launch {
        kernel: plan.kernel(),
        geometry: plan.geometry(),
        target: *target,
        args: Args::Plain(args),
    })
}

/// A fused all-reduce + residual add + RMSNorm launch of `plan`.
pub fn bind_fused(
    plan: &Plan,
    target: &Target,
    ops: &FusedOperands<'_>,
    eps: f64,
) -> Result<Launch> {
    if plan.route() != Route::Fused || plan.world() != target.world {
        return Err(invalid("plan", "a fused plan of this world size", format!("{plan:?}")));
    }
    let metas = [
        ("inp", ops.inp),
        ("residual", ops.residual),
        ("out", ops.out),
        ("residual_out", ops.residual_out),
    ];
    for (name, meta) in metas {
        operand(plan, target, name, meta)?;
    }
    Operand::new(OP, "weight", ops.weight)
        .dtype(&[plan.dtype()])?
        .device(target.device)?
        .shape(&[Some(plan.hidden() as i64)])?
        .contiguous()?
        .aligned(ALIGN)?;
    let (out, residual_out) = (ops.out.address(), ops.residual_out.address());
    if out == residual_out {
        return Err(invalid("out", "a buffer distinct from residual_out", format!("{out:#x}")));
    }
    if eps.is_nan() || eps < 0.0 {
        return Err(invalid("eps", "a non-negative epsilon", eps.to_string()));
    }
    // the fused plan's slot holds its input: staged_bytes == nbytes <= slot
    if plan.staged_bytes() > target.slot_bytes {
        return Err(Error::Capacity {
            op: OP,
            operand: "inp".into(),
            limit: target.slot_bytes,
            got: plan.staged_bytes(),
            hint: "staged bytes; declare through this runtime, whose limits size its slots".into(),
        });
    }
    let args = FusedArgs {
        inp: ops.inp.address(),
        residual: ops.residual.address(),
        weight: ops.weight.address(),
        out,
        residual_out,
        rows: plan.rows(),
        row_packs: plan.row_packs(),
        hidden: plan.hidden(),
        eps: eps as f32,
    };
    Ok(Launch {
        kernel: plan.kernel(),
        geometry: plan.geometry(),
        target: *target,
        args: Args::Fused(args),
    })
}

/// Whether a plain call of `plan` on `inp` (into a fresh output of the same
/// layout) would launch: the checks of [`bind_plain`].
pub fn admit_plain(plan: &Plan, target: &Target, inp: &TensorMeta) -> Result<()> {
    bind_plain(plan, target, inp, inp).map(|_| ())
}

/// Whether a fused call with `residual_out = residual` into `out` (None: in
/// place, `out = inp`) would launch: the checks of [`bind_fused`].
pub fn admit_fused(
    plan: &Plan,
    target: &Target,
    inp: &TensorMeta,
    residual: &TensorMeta,
    weight: &TensorMeta,
    out: Option<&TensorMeta>,
    eps: f64,
) -> Result<()> {
    let out = out.unwrap_or(inp);
    let ops = FusedOperands { inp, residual, weight, out, residual_out: residual };
    bind_fused(plan, target, &ops, eps).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allreduce::layout::SlabLayout;
    use crate::allreduce::limits::Limits;
    use crate::allreduce::plan::Setup;
    use crate::allreduce::route::Declared;
    use crate::collective::Operation;
    use crate::tensor::DType;

    fn meta(dtype: DType, shape: &[i64], strides: &[i64], ptr: u64, device: Device) -> TensorMeta {
        TensorMeta {
            dtype,
            device,
            shape: shape.iter().copied().collect(),
            strides: strides.iter().copied().collect(),
            data_ptr: ptr,
            byte_offset: 0,
        }
    }

    fn dense(shape: &[i64], ptr: u64) -> TensorMeta {
        let strides = TensorMeta::contiguous_strides(shape);
        meta(DType::BF16, shape, &strides, ptr, Device::Cuda(1))
    }

    fn limits() -> Limits {
        Limits::new(64 << 10, 64 << 10, 1 << 20, 8).unwrap()
    }

    fn plan(operation: Operation, shape: &[i64], push: bool) -> Plan {
        let setup = Setup { world: 2, multiprocessors: 132, twoshot_push: push };
        let d = Declared { operation, shape, dtype: DType::BF16, strides: None };
        Plan::new(&d, &setup, &limits()).unwrap()
    }

    fn target(push: bool) -> Target {
        Target {
            device: Device::Cuda(1),
            world: 2,
            slot_bytes: SlabLayout::for_limits(&limits(), push).slot_bytes,
        }
    }

    #[test]
    fn a_plain_launch_carries_the_plan_and_the_addresses() {
        let p = plan(Operation::AllReduce, &[4, 64], false);
        let l = bind_plain(&p, &target(false), &dense(&[4, 64], 0x1000), &dense(&[4, 64], 0x9000))
            .unwrap();
        assert_eq!(l.kernel, p.kernel());
        assert_eq!(l.args, Args::Plain(PlainArgs { inp: 0x1000, out: 0x9000, packs: 32 }));
        // a transposed dense view is fine for the one-shot, its output must match it
        let t = meta(DType::BF16, &[64, 4], &[1, 64], 0x1000, Device::Cuda(1));
        assert!(bind_plain(&p, &target(false), &t, &t).is_ok());
        let e = bind_plain(&p, &target(false), &t, &dense(&[64, 4], 0x9000)).unwrap_err();
        assert!(matches!(e, Error::Layout { .. }), "{e}");
    }

    #[test]
    fn every_operand_check_names_its_operand() {
        let p = plan(Operation::AllReduce, &[4, 64], false);
        let t = target(false);
        let ok = dense(&[4, 64], 0x1000);
        let cases = [
            (meta(DType::F16, &[4, 64], &[64, 1], 0x1000, Device::Cuda(1)), "dtype"),
            (meta(DType::BF16, &[4, 64], &[64, 1], 0x1000, Device::Cuda(0)), "device"),
            (meta(DType::BF16, &[4, 64], &[64, 1], 0x1000, Device::Cpu), "device"),
            (dense(&[4, 64], 0x1008), "alignment"),
            (dense(&[4, 65], 0x1000), "shape"),
            (meta(DType::BF16, &[4, 64], &[128, 1], 0x1000, Device::Cuda(1)), "strides"),
        ];
        for (bad, what) in &cases {
            let e = bind_plain(&p, &t, bad, &ok).unwrap_err().to_string();
            assert!(e.starts_with("AllReduce: inp expected") && e.contains(what), "{e}");
            let e = bind_plain(&p, &t, &ok, bad).unwrap_err().to_string();
            assert!(e.starts_with("AllReduce: out expected"), "{e}");
            assert!(admit_plain(&p, &t, bad).is_err());
        }
        assert!(admit_plain(&p, &t, &ok).is_ok());
    }

    #[test]
    fn the_runtime_must_fit_the_plan() {
        let push = plan(Operation::AllReduce, &[1 << 19], true); // 1 MiB, staged twice
        let x = dense(&[1 << 19], 0x1000);
        assert!(bind_plain(&push, &target(true), &x, &x).is_ok());
        let e = bind_plain(&push, &target(false), &x, &x).unwrap_err().to_string();
        assert!(e.contains("staged bytes"), "{e}");
        let other_world = Target { world: 4, ..target(true) };
        assert!(bind_plain(&push, &other_world, &x, &x).is_err());
        let fused = plan(Operation::AllReduceFusedAddRmsNorm, &[4, 64], false);
        assert!(bind_plain(&fused, &target(false), &x, &x).is_err());
    }

    #[test]
    fn fused_checks_weight_aliasing_and_epsilon() {
        let p = plan(Operation::AllReduceFusedAddRmsNorm, &[4, 64], false);
        let t = target(false);
        let (inp, res, w) =
            (dense(&[4, 64], 0x1000), dense(&[4, 64], 0x2000), dense(&[64], 0x3000));
        let l = admit_fused(&p, &t, &inp, &res, &w, None, 1e-6);
        assert!(l.is_ok());
        let ops =
            FusedOperands { inp: &inp, residual: &res, weight: &w, out: &inp, residual_out: &res };
        let l = bind_fused(&p, &t, &ops, 1e-6).unwrap();
        let Args::Fused(a) = l.args else { panic!("{l:?}") };
        assert_eq!(
            (a.rows, a.row_packs, a.hidden, a.out, a.residual_out),
            (4, 8, 64, 0x1000, 0x2000)
        );
        // residual == inp: out would alias residual_out
        assert!(admit_fused(&p, &t, &inp, &inp, &w, None, 1e-6)
            .unwrap_err()
            .to_string()
            .contains("distinct"));
        assert!(admit_fused(&p, &t, &inp, &res, &w, None, -1.0).is_err());
        assert!(admit_fused(&p, &t, &inp, &res, &w, None, f64::NAN).is_err());
        let w_cpu = meta(DType::BF16, &[64], &[1], 0x3000, Device::Cpu);
        let e = admit_fused(&p, &t, &inp, &res, &w_cpu, None, 1e-6).unwrap_err().to_string();
        assert!(e.starts_with("AllReduce: weight expected device cuda:1"), "{e}");
        let e = admit_fused(&p, &t, &inp, &res, &dense(&[32], 0x3000), None, 1e-6).unwrap_err();
        assert!(matches!(e, Error::Shape { .. }));
        let plain = plan(Operation::AllReduce, &[4, 64], false);
        assert!(admit_fused(&plain, &t, &inp, &res, &w, None, 1e-6).is_err());
    }

    #[test]
    fn a_separate_out_is_admitted_as_its_launch_checks_it() {
        let p = plan(Operation::AllReduceFusedAddRmsNorm, &[4, 64], false);
        let t = target(false);
        let (inp, res, w) =
            (dense(&[4, 64], 0x1000), dense(&[4, 64], 0x2000), dense(&[64], 0x3000));
        assert!(admit_fused(&p, &t, &inp, &res, &w, Some(&dense(&[4, 64], 0x4000)), 1e-6).is_ok());
        let cases = [
            (meta(DType::F16, &[4, 64], &[64, 1], 0x4000, Device::Cuda(1)), "dtype"),
            (meta(DType::BF16, &[4, 64], &[64, 1], 0x4000, Device::Cpu), "device"),
            (dense(&[4, 64], 0x4008), "alignment"),
            (meta(DType::BF16, &[4, 64], &[1, 4], 0x4000, Device::Cuda(1)), "row-major"),
            (dense(&[4, 64], 0x2000), "distinct"), // out would alias residual_out
        ];
        for (out, what) in &cases {
            let e = admit_fused(&p, &t, &inp, &res, &w, Some(out), 1e-6).unwrap_err().to_string();
            assert!(e.contains("out expected") && e.contains(what), "{e}");
        }
    }
}
