// The exact Hopper scorers' operands (indexer_wgmma.cu and the TMA-fed one in
// indexer_hopper.cu): FP8 widened to f16 for `wgmma m64nNk16 .f16`, with K
// (the tokens) as A from registers and the rows' Q as B in shared memory.
//
// The 128 dims are taken in a permuted order (any one permutation applied to
// both operands leaves the dot product unchanged), chosen so that a lane's A
// fragments are its own 32 bytes of a token row (lane t = lane % 4 holds
// bytes 32t .. 32t + 31, words W0..W7): logical dims 16s + 2t + e and
// 16s + 8 + 2t + e (k16 step s, e = 0, 1) are bytes 32t + 4s + e and
// 32t + 4s + 2 + e, so the fragment of step s is word W_s widened by one cvt
// per half.
#pragma once
#include "indexer_common.cuh"

// Byte offset of 16-byte chunk `chunk` of 128-byte row `row` in the
// 128-byte-swizzled layout (wgmma's and TMA's): chunk index XOR (row mod 8).
__device__ __forceinline__ u32 sw128(u32 row, u32 chunk) {
    return row * IDX_HEAD_DIM + ((chunk ^ (row & 7)) << 4);
}

// This lane's words W0..W7 of token rows t_lo (w0) and t_lo + 8 (w1) of a
// swizzled FP8 page (`page`: 64 rows of 128 bytes): chunks 2 tig, 2 tig + 1.
__device__ __forceinline__ void f16_lane_words(const u8* page, u32 t_lo, u32 tig, u32 (&w0)[8],
                                               u32 (&w1)[8]) {
    const uint4 r0a = *reinterpret_cast<const uint4*>(page + sw128(t_lo, 2 * tig));
    const uint4 r0b = *reinterpret_cast<const uint4*>(page + sw128(t_lo, 2 * tig + 1));
    const uint4 r1a = *reinterpret_cast<const uint4*>(page + sw128(t_lo + 8, 2 * tig));
    const uint4 r1b = *reinterpret_cast<const uint4*>(page + sw128(t_lo + 8, 2 * tig + 1));
    const u32 a[8] = {r0a.x, r0a.y, r0a.z, r0a.w, r0b.x, r0b.y, r0b.z, r0b.w};
    const u32 b[8] = {r1a.x, r1a.y, r1a.z, r1a.w, r1b.x, r1b.y, r1b.z, r1b.w};
#pragma unroll
    for (int s = 0; s < 8; ++s) {
        w0[s] = a[s];
        w1[s] = b[s];
    }
}

// The f16 A fragment of k16 step s from the lane's words.
__device__ __forceinline__ void f16_a_fragment(const u32 (&w0)[8], const u32 (&w1)[8], int s,
                                               u32 (&a)[4]) {
    cvt_e4m3x4(w0[s], a[0], a[2]);
    cvt_e4m3x4(w1[s], a[1], a[3]);
}

// FP8 chunk i (bytes 16i .. 16i + 15) of B row n = (row offset) * NH + head
// of the rows from row0; 0 past p.rows and p.heads (padded heads and rows).
template <int NH>
__device__ __forceinline__ uint4 q_chunk(const ScoreParams& p, u32 row0, u32 n, u32 i) {
    const u32 rr = n / NH, h = n % NH, row = row0 + rr;
    if (row >= p.rows || h >= p.heads) return make_uint4(0, 0, 0, 0);
    return __ldg(
        reinterpret_cast<const uint4*>(p.q + ((u64)row * p.heads + h) * IDX_HEAD_DIM + i * 16));
}

// Q of rows row0 .. row0 + N / NH - 1 as the f16 B operand, B row n = (row
// offset) * NH + head, in two halves of 64 dims (`half0`, `half0 +
// half_bytes`), each [N rows][128 bytes] swizzled: FP8 chunk i of a row
// (bytes 16i .. 16i + 15: lane t = i / 2, words 4 (i % 2) .. + 3) lands in
// half i % 2, its word w widened to the f16 pairs of logical dims 16s + 2t
// (16-byte chunk 2w of the half row) and 16s + 8 + 2t (chunk 2w + 1),
// s = 4 (i % 2) + w, each at byte 4t. Heads past p.heads and rows past
// p.rows are 0. Threads `tid` of `threads` share the work.
template <int NH, u32 N>
__device__ __forceinline__ void f16_stage_q(const ScoreParams& p, u8* half0, u32 half_bytes,
                                            u32 row0, u32 tid, u32 threads) {
#pragma unroll 4
    for (u32 c = tid; c < N * 8; c += threads) {
        const u32 n = c >> 3, i = c & 7;
        const uint4 v = q_chunk<NH>(p, row0, n, i);
        const u32 t = i >> 1;
        const u32 words[4] = {v.x, v.y, v.z, v.w};
        u8* half = half0 + (i & 1) * half_bytes;
#pragma unroll
        for (u32 w = 0; w < 4; ++w) {
            u32 lo, hi;
            cvt_e4m3x4(words[w], lo, hi);
            *reinterpret_cast<u32*>(half + sw128(n, 2 * w) + 4 * t) = lo;
            *reinterpret_cast<u32*>(half + sw128(n, 2 * w + 1) + 4 * t) = hi;
        }
    }
}
