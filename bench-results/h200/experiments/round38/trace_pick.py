"""Round 38: globaltimer stamps in rank 0's pick of select_cluster, on main
at a3cba16 (the u32 slot word, where round 37's trace_select.py `main` form
no longer applies; caf4423 then removed the pick's clearing this patches),
for a diagnostic wheel, never for main:

    python3 trace_pick.py kernels/indexer_select.cu && ./dev ptx && ./dev wheel

It reuses round 37's stamps for the levels and adds, for thread 0 of rank 0,
the pick's steps: `pzero` (clearing its histogram and the CTA barrier),
`phist` (counting the pool), `pdigit` (the first level's digit), `pmore`
(any further levels; `levels` says how many ran) and `pemit` (the emit and
the closing CTA barrier). tools/gpu/trace_summary.py reads the lines."""

# ruff: noqa: E501 (anchors copy the kernel's own lines)
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "round37"))
import trace_select as r37

PICK_STAMPS = [
    (
        "#define SC_STAMP(i)",
        """__shared__ unsigned long long sc_pick_t[4];
__shared__ unsigned sc_levels;
#define SC_PICK(i) do { if (threadIdx.x == 0) sc_pick_t[i] = sc_now(); } while (0)
#define SC_STAMP(i)""",
    ),
    (
        """        __syncthreads();  // the pool written, `hist` cleared
""",
        """        __syncthreads();  // the pool written, `hist` cleared
        if (lv == 0) SC_PICK(0);
""",
    ),
    (
        """            if ((v & cmask) == cprefix) atomicAdd(&hist[(u32)(v >> shift) & (bins - 1)], 1u);
        }
        __syncthreads();
""",
        """            if ((v & cmask) == cprefix) atomicAdd(&hist[(u32)(v >> shift) & (bins - 1)], 1u);
        }
        __syncthreads();
        if (lv == 0) SC_PICK(1);
""",
    ),
    (
        """                   [&](u32) { return need; }, sums, found);
        need -= found[1];""",
        """                   [&](u32) { return need; }, sums, found);
        if (lv == 0) SC_PICK(2);
        if (threadIdx.x == 0) sc_levels = lv + 1;
        need -= found[1];""",
    ),
    (
        """        if (found[2] == need) break;  // uniform: the whole bin is taken
    }
}""",
        """        if (found[2] == need) break;  // uniform: the whole bin is taken
    }
    SC_PICK(3);
}""",
    ),
]
GATHER = (
    """                          [&](u32 slot, u64 v) { dsmem_store_u64(pool0 + slot * 8u, v); });
        cluster_sync();
        if (rank != 0) return;
        if (tid == 0) slots_taken = K - need;  // the keys above bin d took slots 0..K-need-1
        t.emit_picked(p, pool, ties, need, prefix, pmask, total_hist, sums, found,
                      [&](u32 c) { return atomicAdd(&slots_taken, c); });
        return;""",
    """                          [&](u32 slot, u64 v) { dsmem_store_u64(pool0 + slot * 8u, v); });
        SC_STAMP(6);
        cluster_sync();
        T[7] = sc_now();
        const u32 need0 = need;
        if (rank == 0) {
        if (tid == 0) slots_taken = K - need;  // the keys above bin d took slots 0..K-need-1
        t.emit_picked(p, pool, ties, need, prefix, pmask, total_hist, sums, found,
                      [&](u32 c) { return atomicAdd(&slots_taken, c); });
        SC_STAMP(8);
        }
"""
    + r37.report(
        ("wait", "T[1]-T[0]"),
        ("load", "T[2]-T[1]"),
        ("hist", "T[3]-T[2]"),
        ("xchg", "T[4]-T[3]"),
        ("digit", "T[5]-T[4]"),
        ("gather", "T[6]-T[5]"),
        ("sync", "T[7]-T[6]"),
        ("pick", "rank == 0 ? T[8]-T[7] : 0ull"),
        ("pzero", "rank == 0 ? sc_pick_t[0]-T[7] : 0ull"),
        ("phist", "rank == 0 ? sc_pick_t[1]-sc_pick_t[0] : 0ull"),
        ("pdigit", "rank == 0 ? sc_pick_t[2]-sc_pick_t[1] : 0ull"),
        ("pmore", "rank == 0 ? sc_pick_t[3]-sc_pick_t[2] : 0ull"),
        ("pemit", "rank == 0 ? T[8]-sc_pick_t[3] : 0ull"),
        ("levels", "rank == 0 ? (unsigned long long)sc_levels : 0ull"),
    ),
)


def main() -> None:
    path = Path(sys.argv[1])
    s = path.read_text()
    for old, new in [r37.STAMPS, *PICK_STAMPS, *r37.NO_FIRST_BARRIER, *r37.LEVEL, GATHER]:
        assert old in s, old
        s = s.replace(old, new, 1)
    path.write_text(s)


if __name__ == "__main__":
    main()
