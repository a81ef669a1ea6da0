// Slab layout, signalling and pack math shared by the all-reduce kernels.
// The layout constants are mirrored by b12x_core::allreduce::layout (a Rust
// test pins them to the values below).
#pragma once

#include "common.cuh"

// Slab of one rank: [header | flags | pad to AR_SIGNAL_BYTES | slot 0 | slot 1].
// header (u32): [0] epoch, [1] CTAs arrived this launch, [2] error code.
// flags: u32 [AR_MAX_CTAS][AR_MAX_WORLD]; flags[b][s] is written by rank s
// (a remote store) and polled by CTA b of the owner.
#define AR_MAX_WORLD 8u
#define AR_MAX_CTAS 128u
#define AR_FLAGS_OFFSET 256u
#define AR_SIGNAL_BYTES 8192u
// error code: AR_ERR_TIMEOUT | rank that did not arrive
#define AR_ERR_TIMEOUT 0x100u

// Per-runtime constants, passed by value (identical for every launch of a rank).
struct ArCtx {
    u64 peers;       // device table: u64 slab base of every rank, as mapped here
    u64 own;         // own slab base
    u64 host_err;    // host-mapped u32 the host reads without a sync
    u64 slot_bytes;  // bytes of one slot (a multiple of 256)
    u64 timeout_ns;  // bound of every cross-GPU wait
    u32 rank;
    u32 world;
};

struct ArHeader {
    u32 epoch;
    u32 error;
};

// ------------------------------------------------------------ memory ops
__device__ __forceinline__ uint4 ld_v4(const void* p) {
    uint4 v;
    asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// A peer's slot: relaxed at system scope, so no stale line from an earlier
// call can be served; ordering comes from the barrier's acquire fence.
__device__ __forceinline__ uint4 ld_peer_v4(const void* p) {
    uint4 v;
    asm volatile("ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

__device__ __forceinline__ void st_v4(void* p, uint4 v) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

__device__ __forceinline__ u64 ld_nc_u64(const u64* p) {
    u64 v;
    asm("ld.global.nc.u64 %0, [%1];" : "=l"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ u32 ld_relaxed_sys(const u32* p) {
    u32 v;
    asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_relaxed_sys(u32* p, u32 v) {
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void fence_acq_rel_sys() {
    asm volatile("fence.acq_rel.sys;" ::: "memory");
}

__device__ __forceinline__ u64 global_timer_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// ------------------------------------------------------------ header, slots
__device__ __forceinline__ ArHeader ar_read_header(const ArCtx& c) {
    u32 e, a, err, pad;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(e), "=r"(a), "=r"(err), "=r"(pad)
                 : "l"(c.own)
                 : "memory");
    return ArHeader{e, err};
}

__device__ __forceinline__ u64 ar_slot_offset(const ArCtx& c, u32 epoch) {
    return AR_SIGNAL_BYTES + (u64)(epoch & 1u) * c.slot_bytes;
}

__device__ __forceinline__ void ar_load_peers(const ArCtx& c, u64 slot, const u8* peers[]) {
#pragma unroll
    for (u32 r = 0; r < AR_MAX_WORLD; ++r)
        peers[r] = r < c.world ? (const u8*)(ld_nc_u64((const u64*)c.peers + r) + slot) : nullptr;
}

__device__ __forceinline__ void ar_report(const ArCtx& c, u32 code) {
    st_relaxed_sys((u32*)c.own + 2, code);
    st_relaxed_sys((u32*)c.host_err, code);
}

// CTA b of this rank meets CTA b of every peer. Thread t < world (t != rank)
// publishes `gen` into rank t's flag [b][rank] after a release fence that
// covers the CTA's earlier stores (ordered by the __syncthreads), then waits
// for rank t's flag [b][t] here to reach `gen`. Generations only grow and a
// peer can be at most one barrier ahead, so "reached" is (int)(flag - gen) >= 0.
// Returns false on timeout (after recording the error for the host).
__device__ __forceinline__ bool ar_barrier(const ArCtx& c, u32 gen) {
    __syncthreads();
    int bad = 0;
    const u32 t = threadIdx.x;
    if (t < c.world && t != c.rank) {
        const u64 flag = AR_FLAGS_OFFSET + (u64)(blockIdx.x * AR_MAX_WORLD) * 4;
        u32* remote = (u32*)(ld_nc_u64((const u64*)c.peers + t) + flag + c.rank * 4);
        const u32* local = (const u32*)(c.own + flag + t * 4);
        fence_acq_rel_sys();
        st_relaxed_sys(remote, gen);
        const u64 start = global_timer_ns();
        while ((int)(ld_relaxed_sys(local) - gen) < 0) {
            if (global_timer_ns() - start > c.timeout_ns) {
                ar_report(c, AR_ERR_TIMEOUT | t);
                bad = 1;
                break;
            }
        }
        fence_acq_rel_sys();
    }
    return !__syncthreads_or(bad);
}

// The last CTA of the launch advances the epoch for the next launch (which,
// being stream-ordered, starts after this one has finished).
__device__ __forceinline__ void ar_advance_epoch(const ArCtx& c, u32 epoch) {
    if (threadIdx.x == 0) {
        u32* h = (u32*)c.own;
        if (atomicAdd(h + 1, 1u) == gridDim.x - 1) {
            h[1] = 0;
            st_relaxed_sys(h, epoch + 1);
        }
    }
}

// Sum over the CTA; every thread gets the same bits (xor butterflies are
// symmetric and each warp reduces the partials in the same order).
__device__ __forceinline__ float ar_block_sum(float v, float* partial) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    float t = lane < (blockDim.x >> 5) ? partial[lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    __syncthreads();
    return t;
}

// ------------------------------------------------------------ 16-byte packs
template <typename T>
struct Pack;

template <>
struct Pack<__nv_bfloat16> {
    static constexpr int N = 8;
    static __device__ __forceinline__ void to_f32(uint4 v, float* f) {
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
    static __device__ __forceinline__ void add_f32(uint4 v, float* f) {
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f[2 * i] += __uint_as_float(w[i] << 16);
            f[2 * i + 1] += __uint_as_float(w[i] & 0xffff0000u);
        }
    }
    static __device__ __forceinline__ uint4 from_f32(const float* f) {
        u32 w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
            w[i] = *reinterpret_cast<u32*>(&h);
        }
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
};

template <>
struct Pack<__half> {
    static constexpr int N = 8;
    static __device__ __forceinline__ void to_f32(uint4 v, float* f) {
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
            f[2 * i] = x.x;
            f[2 * i + 1] = x.y;
        }
    }
    static __device__ __forceinline__ void add_f32(uint4 v, float* f) {
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
            f[2 * i] += x.x;
            f[2 * i + 1] += x.y;
        }
    }
    static __device__ __forceinline__ uint4 from_f32(const float* f) {
        u32 w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            __half2 h = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
            w[i] = *reinterpret_cast<u32*>(&h);
        }
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
};

template <>
struct Pack<float> {
    static constexpr int N = 4;
    static __device__ __forceinline__ void to_f32(uint4 v, float* f) {
        f[0] = __uint_as_float(v.x);
        f[1] = __uint_as_float(v.y);
        f[2] = __uint_as_float(v.z);
        f[3] = __uint_as_float(v.w);
    }
    static __device__ __forceinline__ void add_f32(uint4 v, float* f) {
        f[0] += __uint_as_float(v.x);
        f[1] += __uint_as_float(v.y);
        f[2] += __uint_as_float(v.z);
        f[3] += __uint_as_float(v.w);
    }
    static __device__ __forceinline__ uint4 from_f32(const float* f) {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                          __float_as_uint(f[3]));
    }
};
