"""Lane-level model of round 49's `rk` (patches/rk.patch): rank_group_log2
and ThreadKeys::emit_ranked of kernels/indexer_select.cu, every CTA of a row
ranking its share of the candidates with 1024 lanes, xor-shuffle sums within
groups of 2^g lanes. Checks on random pools (a third of them all one key)
that the slots K - need .. K - 1 get exactly the `need` largest candidates,
each once, and no other slot is written. Run: .venv/bin/python THIS_FILE
(numpy); it prints how many pools took the ranked path and how many fell
back to the last CTA's pick."""

import numpy as np

THREADS = 1024
RANK_STEPS = 64  # SG_RANK_STEPS
INVALID = np.uint64(2**64 - 1)  # a lane without a candidate: nothing is above it


def rank_group_log2(ties: int, parts: int) -> int | None:
    """The kernel's rank_group_log2; None for SG_NO_RANK."""
    per = (ties + parts - 1) // parts
    if per > THREADS:
        return None
    g_log2 = min(5, (THREADS // per).bit_length() - 1)
    g = 1 << g_log2
    steps = (ties + g - 1) // g * ((per * g + THREADS - 1) // THREADS)
    return g_log2 if steps <= RANK_STEPS else None


def emit_ranked(pool, need, base, first, stride, g_log2, out):
    """One CTA's emit_ranked: pool[first], pool[first + stride], ... ranked
    against the whole pool, rank r < need written to out[base + r]."""
    count, g = len(pool), 1 << g_log2
    groups = THREADS >> g_log2
    lanes = np.arange(THREADS)
    sub = lanes & (g - 1)
    mine_count = (count - first + stride - 1) // stride if count > first else 0
    for k0 in range(0, mine_count, groups):
        k = k0 + (lanes >> g_log2)
        valid = k < mine_count
        mine = np.where(valid, pool[np.minimum(first + k * stride, count - 1)], INVALID)
        above = np.array([(pool[sub[t] :: g] > mine[t]).sum() for t in lanes], dtype=np.int64)
        o = g >> 1
        while o > 0:  # __shfl_xor_sync within groups of g lanes
            above = above + above[lanes ^ o]
            o >>= 1
        for t in np.flatnonzero(valid & (sub == 0) & (above < need)):
            slot = base + above[t]
            assert out[slot] == -1, f"slot {slot} written twice"
            out[slot] = mine[t]


def main() -> None:
    rng = np.random.default_rng(1)
    ranked = fallback = 0
    for trial in range(300):
        parts = int(rng.choice([4, 8, 16, 32, 64, 128]))
        ties = int(rng.integers(1, 4000))
        k = int(rng.choice([512, 1024, 2048]))
        need = int(rng.integers(1, min(ties, k) + 1))
        keys = rng.integers(0, 2**21, size=ties) | (5 << 21)  # one first digit: one bin
        if trial % 3 == 0:
            keys[:] = keys[0]  # every key equal: the positions decide
        pos = rng.permutation(200000)[:ties].astype(np.uint32)
        pool = (keys.astype(np.uint64) << np.uint64(32)) | (~pos).astype(np.uint64)
        g_log2 = rank_group_log2(ties, parts)
        if g_log2 is None:
            fallback += 1
            continue
        out = np.full(k, -1, dtype=object)
        base = k - need
        for part in range(parts):
            emit_ranked(pool, need, base, part, parts, g_log2, out)
        got = sorted(int(x) for x in out[base:])
        want = sorted(int(x) for x in np.sort(pool)[::-1][:need])
        assert got == want, (trial, ties, parts)
        assert all(x == -1 for x in out[:base]), (trial, ties, parts)
        ranked += 1
    print("checked", ranked, "fallback", fallback)


if __name__ == "__main__":
    main()
