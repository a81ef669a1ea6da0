//! Declared-plan lookup, key construction included: N declarations of
//! `(r, 16)` bf16 for r = 1..=N (the shapes of `b12x bench lookup`); `hit`
//! asks for the last one, `miss` for `(N + 1, 16)`.

use std::hint::black_box;

use b12x_core::collective::{DeclaredPlanIndex, Entry, Operation, PlanKey};
use b12x_core::DType;
use criterion::{criterion_group, BenchmarkId, Criterion};

const SIZES: [i64; 4] = [64, 512, 4096, 65536];

fn index_of(n: i64) -> DeclaredPlanIndex<u64> {
    DeclaredPlanIndex::new((1..=n).map(|r| {
        Entry {
            name: r.to_string(),
            key: PlanKey::new(Operation::AllReduce, DType::BF16, &[r, 16], &[16, 1], None)
                .expect("a valid key"),
            payload: r as u64,
        }
    }))
}

/// What a live call does: key from the tensor's metadata, one probe.
fn lookup(index: &DeclaredPlanIndex<u64>, shape: &[i64], strides: &[i64]) -> Option<u64> {
    let key = PlanKey::new(Operation::AllReduce, DType::BF16, shape, strides, None).ok()?;
    index.lookup(&key).map(|hit| hit.payload)
}

fn bench_lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("declared_plan_lookup");
    for n in SIZES {
        let index = index_of(n);
        let strides = [16i64, 1];
        for (case, rows, expect) in [("hit", n, Some(n as u64)), ("miss", n + 1, None)] {
            let shape = [rows, 16i64];
            assert_eq!(lookup(&index, &shape, &strides), expect);
            group.bench_with_input(BenchmarkId::new(case, n), &shape, |b, shape| {
                b.iter(|| lookup(black_box(&index), black_box(shape), black_box(&strides)))
            });
            // The same through a per-thread reader (no read-side fence per call).
            let mut reader = index.reader();
            group.bench_with_input(
                BenchmarkId::new(format!("{case}_reader"), n),
                &shape,
                |b, shape| {
                    b.iter(|| {
                        let key = PlanKey::new(
                            Operation::AllReduce,
                            DType::BF16,
                            black_box(shape),
                            black_box(&strides),
                            None,
                        )
                        .ok()?;
                        reader.lookup(&key).map(|e| e.payload)
                    })
                },
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench_lookup);

/// Where a lookup's time goes: hashing a key, loading the snapshot, probing it.
fn bench_parts(c: &mut Criterion) {
    let mut group = c.benchmark_group("declared_plan_lookup_parts");
    let index = index_of(4096);
    let shape = [4096i64, 16];
    let strides = [16i64, 1];
    let key = PlanKey::new(Operation::AllReduce, DType::BF16, &shape, &strides, None).unwrap();
    group.bench_function("hash_only", |b| b.iter(|| black_box(&key).hash64()));
    group.bench_function("key_and_hash", |b| {
        b.iter(|| {
            PlanKey::new(
                Operation::AllReduce,
                DType::BF16,
                black_box(&shape),
                black_box(&strides),
                None,
            )
            .map(|k| k.hash64())
        })
    });
    group.bench_function("contains", |b| {
        b.iter(|| {
            let key = PlanKey::new(
                Operation::AllReduce,
                DType::BF16,
                black_box(&shape),
                black_box(&strides),
                None,
            )
            .ok()?;
            Some(black_box(&index).contains(&key))
        })
    });
    group.bench_function("load_only", |b| b.iter(|| black_box(&index).load().len()));
    group.bench_function("probe_loaded", |b| {
        let snap = index.load();
        b.iter(|| black_box(&snap).get(black_box(&key)).map(|e| e.payload))
    });
    group.finish();
}
criterion_group!(parts, bench_parts);
