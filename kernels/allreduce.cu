// Single-node all-reduce over CUDA IPC: one-shot, fused one-shot + residual
// add + RMSNorm, and two-shot (reduce-scatter + all-gather in one launch).
//
// Every rank owns one IPC slab (layout in allreduce.cuh, mirrored by
// b12x_core::allreduce::layout). Kernels are "staged pull": each rank copies
// its input into its own slot, a CTA-pairwise barrier publishes it, and every
// rank reads its peers' slots. Pack p (16 bytes) is always handled by the same
// (CTA, thread) on every rank and in every phase, so pairing CTA b with CTA b
// of each peer is enough to order the accesses that touch p.
//
// Slot and barrier generation come from an epoch counter in the slab header,
// advanced by the last CTA of every launch: nothing is written by the host
// between launches, so a captured CUDA graph replays correctly.
#include "allreduce.cuh"

// ---------------------------------------------------------------- one-shot
// out[p] = sum over ranks 0..world-1 (fixed order) of inp_r[p], fp32, one rounding.
template <typename T>
__device__ __forceinline__ void oneshot(const ArCtx& c, const T* inp, T* out, u64 packs) {
    const ArHeader h = ar_read_header(c);
    if (h.error) return;
    const u64 slot = ar_slot_offset(c, h.epoch);
    u8* mine = (u8*)c.own + slot;
    const uint4* src = (const uint4*)inp;
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;

    for (u64 p = first; p < packs; p += stride) st_v4(mine + p * 16, ld_v4(src + p));

    const u8* peers[AR_MAX_WORLD];
    ar_load_peers(c, slot, peers);
    if (!ar_barrier(c, 2 * h.epoch + 1)) return;

    for (u64 p = first; p < packs; p += stride) {
        uint4 v[AR_MAX_WORLD];
#pragma unroll
        for (u32 r = 0; r < AR_MAX_WORLD; ++r)
            if (r < c.world) v[r] = r == c.rank ? ld_v4(src + p) : ld_peer_v4(peers[r] + p * 16);
        float acc[Pack<T>::N];
        Pack<T>::to_f32(v[0], acc);
#pragma unroll
        for (u32 r = 1; r < AR_MAX_WORLD; ++r)
            if (r < c.world) Pack<T>::add_f32(v[r], acc);
        st_v4((uint4*)out + p, Pack<T>::from_f32(acc));
    }
    ar_advance_epoch(c, h.epoch);
}

#define ONESHOT(NAME, T)                                                             \
    B12X_KERNEL void __launch_bounds__(1024) NAME(const ArCtx c, const T* inp, T* out, \
                                                  u64 packs) {                       \
        oneshot<T>(c, inp, out, packs);                                              \
    }
ONESHOT(b12x_allreduce_oneshot_f16, __half)
ONESHOT(b12x_allreduce_oneshot_bf16, __nv_bfloat16)
ONESHOT(b12x_allreduce_oneshot_f32, float)

// ---------------------------------------------------------------- fused
// Per row (rows x hidden, row-major, P packs per row), one CTA per row
// (grid-stride over rows), each thread owns packs tid + k*blockDim, k < PPT:
//   a = sum_r x_r (fixed order) + residual          (fp32, unrounded)
//   residual_out = round(a)
//   out = round(a * rsqrt(mean(a^2) + eps) * weight)
// out may alias inp and residual_out may alias residual: each element is read
// by the thread that later writes it, before it writes it.
template <typename T, int PPT>
__device__ __forceinline__ void fused(const ArCtx& c, const T* inp, const T* residual,
                                      const T* weight, T* out, T* residual_out, u32 rows,
                                      u32 row_packs, u32 hidden, float eps) {
    constexpr int N = Pack<T>::N;
    __shared__ float partial[32];
    const ArHeader h = ar_read_header(c);
    if (h.error) return;
    const u64 slot = ar_slot_offset(c, h.epoch);
    u8* mine = (u8*)c.own + slot;
    const uint4* src = (const uint4*)inp;

    for (u32 row = blockIdx.x; row < rows; row += gridDim.x) {
#pragma unroll
        for (int k = 0; k < PPT; ++k) {
            const u32 j = threadIdx.x + k * blockDim.x;
            if (j < row_packs) {
                const u64 p = (u64)row * row_packs + j;
                st_v4(mine + p * 16, ld_v4(src + p));
            }
        }
    }

    const u8* peers[AR_MAX_WORLD];
    ar_load_peers(c, slot, peers);
    if (!ar_barrier(c, 2 * h.epoch + 1)) return;

    for (u32 row = blockIdx.x; row < rows; row += gridDim.x) {
        float a[PPT][N];
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < PPT; ++k) {
            const u32 j = threadIdx.x + k * blockDim.x;
            if (j < row_packs) {
                const u64 p = (u64)row * row_packs + j;
                uint4 v[AR_MAX_WORLD];
#pragma unroll
                for (u32 r = 0; r < AR_MAX_WORLD; ++r)
                    if (r < c.world)
                        v[r] = r == c.rank ? ld_v4(src + p) : ld_peer_v4(peers[r] + p * 16);
                const uint4 res = ld_v4((const uint4*)residual + p);
                Pack<T>::to_f32(v[0], a[k]);
#pragma unroll
                for (u32 r = 1; r < AR_MAX_WORLD; ++r)
                    if (r < c.world) Pack<T>::add_f32(v[r], a[k]);
                Pack<T>::add_f32(res, a[k]);
                st_v4((uint4*)residual_out + p, Pack<T>::from_f32(a[k]));
#pragma unroll
                for (int e = 0; e < N; ++e) ss += a[k][e] * a[k][e];
            }
        }
        const float total = ar_block_sum(ss, partial);
        const float inv = rsqrtf(total / (float)hidden + eps);
#pragma unroll
        for (int k = 0; k < PPT; ++k) {
            const u32 j = threadIdx.x + k * blockDim.x;
            if (j < row_packs) {
                float w[N];
                Pack<T>::to_f32(ld_v4((const uint4*)weight + j), w);
#pragma unroll
                for (int e = 0; e < N; ++e) a[k][e] = a[k][e] * inv * w[e];
                st_v4((uint4*)out + (u64)row * row_packs + j, Pack<T>::from_f32(a[k]));
            }
        }
    }
    ar_advance_epoch(c, h.epoch);
}

#define FUSED(NAME, T, PPT)                                                                \
    B12X_KERNEL void __launch_bounds__(1024, 1)                                            \
        NAME(const ArCtx c, const T* inp, const T* residual, const T* weight, T* out,       \
             T* residual_out, u32 rows, u32 row_packs, u32 hidden, float eps) {             \
        fused<T, PPT>(c, inp, residual, weight, out, residual_out, rows, row_packs, hidden, \
                      eps);                                                                \
    }
FUSED(b12x_allreduce_fused_f16_p1, __half, 1)
FUSED(b12x_allreduce_fused_f16_p2, __half, 2)
FUSED(b12x_allreduce_fused_f16_p4, __half, 4)
FUSED(b12x_allreduce_fused_bf16_p1, __nv_bfloat16, 1)
FUSED(b12x_allreduce_fused_bf16_p2, __nv_bfloat16, 2)
FUSED(b12x_allreduce_fused_bf16_p4, __nv_bfloat16, 4)
FUSED(b12x_allreduce_fused_f32_p1, float, 1)
FUSED(b12x_allreduce_fused_f32_p2, float, 2)
FUSED(b12x_allreduce_fused_f32_p4, float, 4)

// ---------------------------------------------------------------- two-shot
// Rank s owns shard s: packs [s*base + min(s, rem), +base + (s < rem)).
// 1. copy the other ranks' shards of the input into the own slot;
// 2. barrier; reduce the own shard (fixed rank order), store it to out and,
//    in place, to the own slot;
// 3. barrier; pull every other shard's reduced packs from its owner's slot.
// Pack (shard s, index j) is handled by the same (CTA, thread) in every phase
// on every rank, so CTA-pairwise barriers order all accesses.
constexpr u32 TWOSHOT_UNROLL = 4;

__device__ __forceinline__ u64 shard_start(u64 base, u64 rem, u32 s) {
    return s * base + (s < rem ? s : rem);
}

template <typename T>
__device__ __forceinline__ void twoshot(const ArCtx& c, const T* inp, T* out, u64 packs) {
    const ArHeader h = ar_read_header(c);
    if (h.error) return;
    const u64 slot = ar_slot_offset(c, h.epoch);
    u8* mine = (u8*)c.own + slot;
    const uint4* src = (const uint4*)inp;
    uint4* dst = (uint4*)out;
    const u64 base = packs / c.world, rem = packs % c.world;
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;

    for (u32 s = 0; s < c.world; ++s) {
        if (s == c.rank) continue;
        const u64 start = shard_start(base, rem, s), len = base + (s < rem);
        for (u64 j0 = first; j0 < len; j0 += stride * TWOSHOT_UNROLL) {
            uint4 v[TWOSHOT_UNROLL];
#pragma unroll
            for (u32 u = 0; u < TWOSHOT_UNROLL; ++u) {
                const u64 j = j0 + u * stride;
                if (j < len) v[u] = ld_v4(src + start + j);
            }
#pragma unroll
            for (u32 u = 0; u < TWOSHOT_UNROLL; ++u) {
                const u64 j = j0 + u * stride;
                if (j < len) st_v4(mine + (start + j) * 16, v[u]);
            }
        }
    }

    const u8* peers[AR_MAX_WORLD];
    ar_load_peers(c, slot, peers);
    if (!ar_barrier(c, 2 * h.epoch + 1)) return;

    {
        const u64 start = shard_start(base, rem, c.rank), len = base + (c.rank < rem);
        for (u64 j0 = first; j0 < len; j0 += stride * 2) {
            uint4 v[2][AR_MAX_WORLD];
#pragma unroll
            for (u32 u = 0; u < 2; ++u) {
                const u64 j = j0 + u * stride;
                if (j < len) {
                    const u64 p = start + j;
#pragma unroll
                    for (u32 r = 0; r < AR_MAX_WORLD; ++r)
                        if (r < c.world)
                            v[u][r] = r == c.rank ? ld_v4(src + p) : ld_peer_v4(peers[r] + p * 16);
                }
            }
#pragma unroll
            for (u32 u = 0; u < 2; ++u) {
                const u64 j = j0 + u * stride;
                if (j < len) {
                    const u64 p = start + j;
                    float acc[Pack<T>::N];
                    Pack<T>::to_f32(v[u][0], acc);
#pragma unroll
                    for (u32 r = 1; r < AR_MAX_WORLD; ++r)
                        if (r < c.world) Pack<T>::add_f32(v[u][r], acc);
                    const uint4 y = Pack<T>::from_f32(acc);
                    st_v4(dst + p, y);
                    st_v4(mine + p * 16, y);
                }
            }
        }
    }

    if (!ar_barrier(c, 2 * h.epoch + 2)) return;

    for (u32 s = 0; s < c.world; ++s) {
        if (s == c.rank) continue;
        const u64 start = shard_start(base, rem, s), len = base + (s < rem);
        // the table, not peers[s]: a dynamic index would put peers[] on the stack
        const u8* owner = (const u8*)(ld_nc_u64((const u64*)c.peers + s) + slot);
        for (u64 j0 = first; j0 < len; j0 += stride * TWOSHOT_UNROLL) {
            uint4 v[TWOSHOT_UNROLL];
#pragma unroll
            for (u32 u = 0; u < TWOSHOT_UNROLL; ++u) {
                const u64 j = j0 + u * stride;
                if (j < len) v[u] = ld_peer_v4(owner + (start + j) * 16);
            }
#pragma unroll
            for (u32 u = 0; u < TWOSHOT_UNROLL; ++u) {
                const u64 j = j0 + u * stride;
                if (j < len) st_v4(dst + start + j, v[u]);
            }
        }
    }
    ar_advance_epoch(c, h.epoch);
}

// Push transport (NVLink): no staging copy and no remote loads. Rank s's slot
// holds 2 * world regions of `stride` packs (the largest shard):
//   IN[r]     (r != s): rank r's input data of shard s, stored by rank r;
//   GATHER[r] (r != s): rank r's reduced shard r, stored by rank r.
// 1. store the own data of every other shard s into rank s's IN[rank];
// 2. barrier; reduce the own shard from the input and IN[*], store it to out
//    and into every peer's GATHER[rank];
// 3. barrier; copy GATHER[s] of every other shard s (local) into out.
// SM stores to peers are slow over PCIe (spec §11), hence the pull default there.
template <typename T>
__device__ __forceinline__ void twoshot_push(const ArCtx& c, const T* inp, T* out, u64 packs) {
    const ArHeader h = ar_read_header(c);
    if (h.error) return;
    const u64 slot = ar_slot_offset(c, h.epoch);
    u8* mine = (u8*)c.own + slot;
    const uint4* src = (const uint4*)inp;
    uint4* dst = (uint4*)out;
    const u64 base = packs / c.world, rem = packs % c.world;
    const u64 region = (base + (rem != 0)) * 16;  // bytes of one region
    const u64 gather = (u64)c.world * region;     // offset of GATHER[0]
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;

    for (u32 s = 0; s < c.world; ++s) {
        if (s == c.rank) continue;
        const u64 start = shard_start(base, rem, s), len = base + (s < rem);
        u8* in = (u8*)(ld_nc_u64((const u64*)c.peers + s) + slot) + c.rank * region;
        for (u64 j0 = first; j0 < len; j0 += stride * TWOSHOT_UNROLL) {
            uint4 v[TWOSHOT_UNROLL];
#pragma unroll
            for (u32 u = 0; u < TWOSHOT_UNROLL; ++u) {
                const u64 j = j0 + u * stride;
                if (j < len) v[u] = ld_v4(src + start + j);
            }
#pragma unroll
            for (u32 u = 0; u < TWOSHOT_UNROLL; ++u) {
                const u64 j = j0 + u * stride;
                if (j < len) st_v4(in + j * 16, v[u]);
            }
        }
    }

    u8* peers[AR_MAX_WORLD];
#pragma unroll
    for (u32 r = 0; r < AR_MAX_WORLD; ++r)
        peers[r] = r < c.world ? (u8*)(ld_nc_u64((const u64*)c.peers + r) + slot) : nullptr;
    if (!ar_barrier(c, 2 * h.epoch + 1)) return;

    {
        const u64 start = shard_start(base, rem, c.rank), len = base + (c.rank < rem);
        for (u64 j0 = first; j0 < len; j0 += stride * 2) {
            uint4 v[2][AR_MAX_WORLD];
#pragma unroll
            for (u32 u = 0; u < 2; ++u) {
                const u64 j = j0 + u * stride;
                if (j < len) {
#pragma unroll
                    for (u32 r = 0; r < AR_MAX_WORLD; ++r)
                        if (r < c.world)
                            v[u][r] = r == c.rank ? ld_v4(src + start + j)
                                                  : ld_peer_v4(mine + r * region + j * 16);
                }
            }
#pragma unroll
            for (u32 u = 0; u < 2; ++u) {
                const u64 j = j0 + u * stride;
                if (j < len) {
                    float acc[Pack<T>::N];
                    Pack<T>::to_f32(v[u][0], acc);
#pragma unroll
                    for (u32 r = 1; r < AR_MAX_WORLD; ++r)
                        if (r < c.world) Pack<T>::add_f32(v[u][r], acc);
                    const uint4 y = Pack<T>::from_f32(acc);
                    st_v4(dst + start + j, y);
#pragma unroll
                    for (u32 r = 0; r < AR_MAX_WORLD; ++r)
                        if (r < c.world && r != c.rank)
                            st_v4(peers[r] + gather + c.rank * region + j * 16, y);
                }
            }
        }
    }

    if (!ar_barrier(c, 2 * h.epoch + 2)) return;

    for (u32 s = 0; s < c.world; ++s) {
        if (s == c.rank) continue;
        const u64 start = shard_start(base, rem, s), len = base + (s < rem);
        const u8* got = mine + gather + s * region;
        for (u64 j0 = first; j0 < len; j0 += stride * TWOSHOT_UNROLL) {
            uint4 v[TWOSHOT_UNROLL];
#pragma unroll
            for (u32 u = 0; u < TWOSHOT_UNROLL; ++u) {
                const u64 j = j0 + u * stride;
                if (j < len) v[u] = ld_peer_v4(got + j * 16);
            }
#pragma unroll
            for (u32 u = 0; u < TWOSHOT_UNROLL; ++u) {
                const u64 j = j0 + u * stride;
                if (j < len) st_v4(dst + start + j, v[u]);
            }
        }
    }
    ar_advance_epoch(c, h.epoch);
}

B12X_KERNEL void __launch_bounds__(512) b12x_allreduce_twoshot_push_bf16(
    const ArCtx c, const __nv_bfloat16* inp, __nv_bfloat16* out, u64 packs) {
    twoshot_push<__nv_bfloat16>(c, inp, out, packs);
}

B12X_KERNEL void __launch_bounds__(512) b12x_allreduce_twoshot_bf16(const ArCtx c,
                                                                    const __nv_bfloat16* inp,
                                                                    __nv_bfloat16* out,
                                                                    u64 packs) {
    twoshot<__nv_bfloat16>(c, inp, out, packs);
}
