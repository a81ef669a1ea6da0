// Shared helpers for b12x kernels. NVRTC compiles device code only: include
// CUDA's own headers, never host standard headers.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef signed char i8;
typedef unsigned char u8;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define B12X_KERNEL extern "C" __global__

// -inf without <cmath>.
__device__ __forceinline__ float b12x_neg_inf() { return __int_as_float(0xff800000); }
