//! criterion benches of b12x-core: `cargo bench -p b12x-core`.

mod benchmarks;

criterion::criterion_main!(benchmarks::lookup::benches, benchmarks::lookup::parts);
