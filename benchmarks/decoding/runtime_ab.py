"""The accelerated runtime (fastcpu/runtime.py) of the working tree against the one at a git revision, on the embedded target: the same
forward (1 row = a decode step, 4 rows = a chain-3 verify) on a 200-token cache, the two interleaved round by
round (this host's speed drifts by 10-20% within minutes, so back-to-back blocks would measure the drift),
medians, plus the largest logit difference between the two.

    python -m benchmarks.decoding.runtime_ab --against 16325d3 --rounds 40
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from eaglewire.fastcpu import runtime as current
from eaglewire.hw import describe_cpu
from eaglewire import load_target

CACHED = 200  # tokens in the KV cache before the timed forwards


def runtime_at(rev: str):
    """fastcpu/runtime.py as it was at `rev`, imported as its own module (it still imports today's
    eaglewire for everything else)."""
    src = subprocess.run(
        ["git", "show", f"{rev}:src/eaglewire/fastcpu/runtime.py"], check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "runtime_at_rev.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("runtime_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", required=True, help="git revision whose runtime is the baseline")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target = load_target(dtype=torch.float32)
    rts = {
        a.against: runtime_at(a.against).FastRuntime(target, 512, layout="dnnl"),
        "working tree": current.FastRuntime(target, 512, layout="dnnl"),
    }
    prefix = torch.randint(0, target.vocab_size, (1, CACHED), generator=torch.Generator().manual_seed(0))
    for rt in rts.values():
        rt.forward(prefix, torch.arange(CACHED)[None], 0)
    print(describe_cpu())
    for rows in (1, 4):
        ids, pos = torch.randint(0, target.vocab_size, (1, rows)), torch.arange(CACHED, CACHED + rows)[None]
        logits = [rt.forward(ids, pos, CACHED)[0] for rt in rts.values()]
        times: dict[str, list[float]] = {n: [] for n in rts}
        for _ in range(a.rounds):
            for name, rt in rts.items():
                t0 = time.perf_counter()
                rt.forward(ids, pos, CACHED)
                times[name].append(time.perf_counter() - t0)
        print(
            f"{rows} row(s): "
            + ", ".join(f"{n} {statistics.median(t) * 1e3:.2f} ms" for n, t in times.items())
            + f"; max |logit difference| {float((logits[0] - logits[1]).abs().max()):.3g}"
        )


if __name__ == "__main__":
    main()
