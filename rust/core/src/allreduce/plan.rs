//! `Plan`: one declared all-reduce resolved once: its route, the kernel and
//! launch geometry that serve it, and the bytes a launch stages. Like the
//! indexer's plan it holds no addresses; [`super::bind`] pairs it with one
//! call's live tensors.

use std::collections::HashMap;
use std::sync::Arc;

use crate::collective::{address_strides, Operation};
use crate::tensor::{DType, Dims, TensorMeta};

use super::geometry::{fused_geometry, oneshot_geometry, twoshot_geometry, Geometry};
use super::limits::Limits;
use super::route::{route, Declared, Decline, Route};

/// The element types the all-reduce kernels are built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Float {
    F16,
    BF16,
    F32,
}

impl Float {
    pub const ALL: [Float; 3] = [Float::F16, Float::BF16, Float::F32];

    pub const fn dtype(self) -> DType {
        match self {
            Float::F16 => DType::F16,
            Float::BF16 => DType::BF16,
            Float::F32 => DType::F32,
        }
    }

    pub fn of(dtype: DType) -> Option<Float> {
        Float::ALL.into_iter().find(|f| f.dtype() == dtype)
    }
}

/// Packs one thread of the fused kernel holds per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacksPerThread {
    One,
    Two,
    Four,
}

impl PacksPerThread {
    pub const ALL: [PacksPerThread; 3] =
        [PacksPerThread::One, PacksPerThread::Two, PacksPerThread::Four];

    pub const fn count(self) -> u32 {
        match self {
            PacksPerThread::One => 1,
            PacksPerThread::Two => 2,
            PacksPerThread::Four => 4,
        }
    }

    fn of(count: u32) -> Option<PacksPerThread> {
        PacksPerThread::ALL.into_iter().find(|p| p.count() == count)
    }
}

/// The kernel a plan launches (kernels/allreduce.cu); b12x-cuda maps each
/// to its PTX symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    OneShot(Float),
    Fused(Float, PacksPerThread),
    /// bfloat16: the owner pulls its shard from the peers' staged copies.
    TwoShotPull,
    /// bfloat16: peers store their shards into the owner's slot (NVLink).
    TwoShotPush,
}

impl Kernel {
    /// Every kernel a plan can choose.
    pub fn all() -> impl Iterator<Item = Kernel> {
        let oneshot = Float::ALL.into_iter().map(Kernel::OneShot);
        let fused = Float::ALL
            .into_iter()
            .flat_map(|f| PacksPerThread::ALL.into_iter().map(move |p| Kernel::Fused(f, p)));
        oneshot.chain(fused).chain([Kernel::TwoShotPull, Kernel::TwoShotPush])
    }
}

/// What a plan depends on besides the declaration: the group and the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setup {
    pub world: u32,
    /// SM count of the device (one resident CTA per SM bounds every grid).
    pub multiprocessors: u32,
    /// The two-shot transport every rank agreed on.
    pub twoshot_push: bool,
}

/// A prepared all-reduce for one declared (operation, shape, dtype).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    operation: Operation,
    route: Route,
    kernel: Kernel,
    dtype: DType,
    shape: Dims,
    numel: u64,
    world: u32,
    /// Fused: rows x hidden (0 otherwise).
    rows: u32,
    hidden: u32,
    geometry: Geometry,
    staged_bytes: u64,
}

/// Bytes one launch of `kernel` stages in the own slot for `nbytes` of input.
/// The push two-shot holds 2 * world regions of the largest shard; every
/// other kernel stages its input once.
pub fn staged_bytes(kernel: Kernel, nbytes: u64, world: u32) -> u64 {
    match kernel {
        Kernel::TwoShotPush => (nbytes / 16).div_ceil(world as u64) * world as u64 * 32,
        _ => nbytes,
    }
}

impl Plan {
    /// Routes `decl` under `limits` and resolves its kernel and geometry, or
    /// says why no route serves it.
    pub fn new(decl: &Declared<'_>, setup: &Setup, limits: &Limits) -> Result<Plan, Decline> {
        let route = route(decl, setup.world, limits)?;
        // route() accepted the dtype, the extents and the byte count
        let float = Float::of(decl.dtype).ok_or_else(|| Decline("unsupported dtype".into()))?;
        let numel: u64 = decl.shape.iter().map(|&d| d as u64).product();
        let nbytes = numel * decl.dtype.itemsize();
        let packs = nbytes / 16;
        let sms = setup.multiprocessors;
        let (kernel, geometry, rows, hidden) = match route {
            Route::OneShot => (Kernel::OneShot(float), oneshot_geometry(packs, sms), 0, 0),
            Route::TwoShot => {
                let kernel =
                    if setup.twoshot_push { Kernel::TwoShotPush } else { Kernel::TwoShotPull };
                (kernel, twoshot_geometry(packs, setup.world, sms), 0, 0)
            }
            Route::Fused => {
                let hidden = *decl.shape.last().expect("fused routes have a last dimension") as u64;
                let rows = numel / hidden;
                let row_packs = hidden * decl.dtype.itemsize() / 16;
                let rows = u32::try_from(rows)
                    .map_err(|_| Decline(format!("fused needs at most 2^32 rows, got {rows}")))?;
                let g = fused_geometry(rows as u64, row_packs as u32, sms)
                    .ok_or_else(|| Decline(format!("fused rows of {row_packs} packs")))?;
                let ppt = PacksPerThread::of(g.packs_per_thread)
                    .expect("fused geometry picks 1, 2 or 4 packs per thread");
                (Kernel::Fused(float, ppt), g, rows, hidden as u32)
            }
        };
        Ok(Plan {
            operation: decl.operation,
            route,
            kernel,
            dtype: decl.dtype,
            shape: decl.shape.iter().copied().collect(),
            numel,
            world: setup.world,
            rows,
            hidden,
            geometry,
            staged_bytes: staged_bytes(kernel, nbytes, setup.world),
        })
    }

    #[inline]
    pub fn operation(&self) -> Operation {
        self.operation
    }
    #[inline]
    pub fn route(&self) -> Route {
        self.route
    }
    #[inline]
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }
    #[inline]
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    #[inline]
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }
    #[inline]
    pub fn numel(&self) -> u64 {
        self.numel
    }
    #[inline]
    pub fn nbytes(&self) -> u64 {
        self.numel * self.dtype.itemsize()
    }
    #[inline]
    pub fn world(&self) -> u32 {
        self.world
    }
    #[inline]
    pub fn rows(&self) -> u32 {
        self.rows
    }
    #[inline]
    pub fn hidden(&self) -> u32 {
        self.hidden
    }
    /// 16-byte packs of one fused row.
    #[inline]
    pub fn row_packs(&self) -> u32 {
        (self.hidden as u64 * self.dtype.itemsize() / 16) as u32
    }
    #[inline]
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }
    /// Bytes one launch stages in the own slot (see [`staged_bytes`]).
    #[inline]
    pub fn staged_bytes(&self) -> u64 {
        self.staged_bytes
    }
    #[inline]
    pub fn twoshot_push(&self) -> bool {
        self.kernel == Kernel::TwoShotPush
    }
}

/// Plans for a list of declarations: equal declarations (route, dtype, shape,
/// address strides) share one plan.
#[derive(Debug, Clone, Default)]
pub struct Prepared {
    /// Distinct plans, in order of first use.
    pub plans: Vec<Arc<Plan>>,
    /// Per declaration, in order: the index of its plan, or why it declines.
    pub outcomes: Vec<Result<usize, Decline>>,
}

/// Routes and prepares every declaration of one declare() call.
pub fn prepare<'a>(
    decls: impl IntoIterator<Item = Declared<'a>>,
    setup: &Setup,
    limits: &Limits,
) -> Prepared {
    let mut out = Prepared::default();
    let mut shared: HashMap<(Route, DType, Dims, Dims), usize> = HashMap::new();
    for decl in decls {
        let outcome = Plan::new(&decl, setup, limits).map(|plan| {
            let contiguous = TensorMeta::contiguous_strides(decl.shape);
            let strides = address_strides(decl.shape, decl.strides.unwrap_or(&contiguous));
            let key = (plan.route, plan.dtype, plan.shape.clone(), strides);
            *shared.entry(key).or_insert_with(|| {
                out.plans.push(Arc::new(plan));
                out.plans.len() - 1
            })
        });
        out.outcomes.push(outcome);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allreduce::layout::SlabLayout;

    const PLAIN: Operation = Operation::AllReduce;
    const FUSED: Operation = Operation::AllReduceFusedAddRmsNorm;

    fn decl(operation: Operation, shape: &[i64], dtype: DType) -> Declared<'_> {
        Declared { operation, shape, dtype, strides: None }
    }

    fn setup(world: u32, push: bool) -> Setup {
        Setup { world, multiprocessors: 132, twoshot_push: push }
    }

    #[test]
    fn plans_carry_route_kernel_and_resident_geometry() {
        let big = Limits::new(1 << 30, 1 << 30, 0, 4096).unwrap();
        let p = Plan::new(&decl(PLAIN, &[1, 8192], DType::BF16), &setup(2, false), &big).unwrap();
        assert_eq!(
            (p.route(), p.kernel(), p.nbytes()),
            (Route::OneShot, Kernel::OneShot(Float::BF16), 16384)
        );
        assert_eq!(p.staged_bytes(), 16384);
        let f = Plan::new(&decl(FUSED, &[16, 7168], DType::BF16), &setup(2, false), &big).unwrap();
        assert_eq!(f.kernel(), Kernel::Fused(Float::BF16, PacksPerThread::One));
        assert_eq!((f.rows(), f.hidden(), f.row_packs()), (16, 7168, 896));
        assert_eq!(f.geometry(), Geometry { grid: 16, block: 896, packs_per_thread: 1 });
        let f32 = Plan::new(&decl(FUSED, &[3, 7168], DType::F32), &setup(8, false), &big).unwrap();
        assert_eq!(f32.geometry(), Geometry { grid: 3, block: 1024, packs_per_thread: 2 });
        assert_eq!(f32.kernel(), Kernel::Fused(Float::F32, PacksPerThread::Two));
    }

    #[test]
    fn two_shot_transport_and_staging() {
        let l = Limits::new(0, 0, 32 << 20, 4096).unwrap();
        let d = decl(PLAIN, &[4096, 4096], DType::BF16);
        for world in [2, 4, 8] {
            let sms = Setup { world, multiprocessors: 36, twoshot_push: false };
            let pull = Plan::new(&d, &sms, &l).unwrap();
            assert_eq!(pull.kernel(), Kernel::TwoShotPull);
            assert!((1..=36).contains(&pull.geometry().grid) && pull.geometry().block == 512);
            assert_eq!(pull.staged_bytes(), 32 << 20);
            let push = Plan::new(&d, &Setup { twoshot_push: true, ..sms }, &l).unwrap();
            assert!(push.twoshot_push());
            assert_eq!(push.staged_bytes(), 64 << 20);
        }
        // a shard count that does not divide the packs rounds each region up
        assert_eq!(staged_bytes(Kernel::TwoShotPush, 3 * 16, 2), 2 * 2 * 32);
        assert_eq!(staged_bytes(Kernel::TwoShotPull, 3 * 16, 2), 48);
    }

    /// The one slot rule: whatever the limits route, its launch fits the
    /// slab those limits size, for both transports and every world.
    #[test]
    fn every_routed_plan_fits_the_slot_its_limits_size() {
        let limits = [
            Limits::new(16 << 10, 72 << 10, 768 << 10, 4096).unwrap(),
            Limits::new(0, 0, 4096, 8).unwrap(),
            Limits::new(512 << 10, 512 << 10, 32 << 20, 8).unwrap(),
            Limits::new(48, 32, 80, 1).unwrap(),
        ];
        let mut routed = 0;
        for l in &limits {
            for push in [false, true] {
                let slot = SlabLayout::for_limits(l, push).slot_bytes;
                for world in 2..=8 {
                    let s = setup(world, push);
                    for n in (1..=64).chain([511, 1000, 4096, 4104, 65536, 1 << 20, 2 << 20]) {
                        for (op, shape) in
                            [(PLAIN, vec![n * 8]), (FUSED, vec![n, 8]), (PLAIN, vec![n, 8])]
                        {
                            for dtype in [DType::BF16, DType::F16, DType::F32] {
                                let Ok(p) = Plan::new(&decl(op, &shape, dtype), &s, l) else {
                                    continue;
                                };
                                routed += 1;
                                assert!(p.staged_bytes() <= slot, "{p:?} in a slot of {slot}");
                            }
                        }
                    }
                }
            }
        }
        assert!(routed > 1000, "{routed}");
    }

    #[test]
    fn equal_declarations_share_one_plan() {
        let l = Limits::new(16 << 10, 72 << 10, 0, 4096).unwrap();
        let mut decls = Vec::new();
        for _ in 0..40 {
            decls.push(decl(PLAIN, &[1, 6144], DType::BF16));
            decls.push(decl(FUSED, &[4, 6144], DType::BF16));
            decls.push(decl(PLAIN, &[16, 4096], DType::BF16)); // 128 KiB: declines
        }
        // the same shape with other (dense) strides is another plan
        decls.push(Declared { strides: Some(&[6144, 1]), ..decl(PLAIN, &[1, 6144], DType::BF16) });
        decls.push(decl(PLAIN, &[8, 768], DType::BF16));
        decls.push(Declared { strides: Some(&[1, 8]), ..decl(PLAIN, &[8, 768], DType::BF16) });
        let p = prepare(decls, &setup(2, false), &l);
        assert_eq!(p.plans.len(), 4);
        let idx: Vec<_> = p.outcomes.iter().map(|o| o.as_ref().ok().copied()).collect();
        assert_eq!(&idx[..3], &[Some(0), Some(1), None]);
        assert!(idx[..120].chunks(3).all(|c| c == [Some(0), Some(1), None]));
        assert_eq!(idx[120], Some(0), "singleton strides are address strides");
        assert_eq!(&idx[121..], &[Some(2), Some(3)]);
        assert!(p.outcomes[2].as_ref().unwrap_err().0.contains("two-shot"));
    }

    #[test]
    fn every_kernel_is_listed_once() {
        let all: Vec<Kernel> = Kernel::all().collect();
        assert_eq!(all.len(), 14);
        let distinct: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), 14);
    }
}
