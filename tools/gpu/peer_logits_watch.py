"""Which arm of a bench case, if any, writes into the DeepGEMM logits the peer check holds?

    python3 tools/gpu/peer_logits_watch.py [case]   (default: prefill_r4096_L32768)

Runs ``b12x bench indexer --no-torch --iters 3`` on one case with three
watches added: every eager DeepGEMM logits tensor is cloned when it is made;
after each arm is declared (its graph captured), and after one replay of each
arm before the timing, every watched tensor is compared with its clone and
the probe prints which are intact. Round 20's interleaved bench found the
prefill case's held logits wrong after the timing (relative error 1.48);
this names the first step after which they differ.
"""

from __future__ import annotations

import sys

import b12x.bench.indexer_stock as stock
import b12x.bench.interleave as interleave
import torch
from b12x import cli

watched: list[tuple[torch.Tensor, torch.Tensor]] = []
declared: list[str] = []


def intact() -> list[bool]:
    torch.cuda.synchronize()
    return [bool(torch.equal(now, then)) for now, then in watched]


def watch(make):
    def made(self):
        out = make(self)
        if not torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()
            watched.append((out, out.clone()))
        return out

    return made


stock.PrefillCall.logits = watch(stock.PrefillCall.logits)
stock.DecodeCall.logits = watch(stock.DecodeCall.logits)
declare = interleave.ArmTimer.__call__


def declare_watched(self, fn, samples=None):
    declared.append(repr(fn)[:100])
    out = declare(self, fn, samples)
    print(f"declared arm {len(declared) - 1} {declared[-1]}: intact {intact()}", flush=True)
    return out


interleave.ArmTimer.__call__ = declare_watched
time_interleaved = interleave.time_interleaved_us


def timed_watched(steps, samples, **kw):
    for i, step in enumerate(steps):
        step()
        print(f"replayed arm {i}: intact {intact()}", flush=True)
    return time_interleaved(steps, samples, **kw)


interleave.time_interleaved_us = timed_watched

if __name__ == "__main__":
    case = sys.argv[1] if len(sys.argv) > 1 else "prefill_r4096_L32768"
    code = cli.main(["bench", "indexer", "--no-torch", "--cases", case, "--iters", "3"])
    print(f"after the timing and the checks: intact {intact()}")
    sys.exit(code)
