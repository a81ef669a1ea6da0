// The floor of a launch: a kernel that does nothing. `b12x bench host` times
// `run(binding)` against as many bare launches of it as the run makes
// (rust/cuda/src/probe.rs).

extern "C" __global__ void b12x_probe_empty() {}
