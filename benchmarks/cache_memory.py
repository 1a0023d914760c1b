"""RSS of a process that compiles a model and calls ``ember.reset()`` again and
again (a long-running server recompiling, a notebook re-running a cell), with a warm
on-disk cache. Prints the resident set size, the generated sources kept and the kernel
libraries loaded, every ``--every`` cycles; flat numbers mean nothing accumulates.

    PYTHONPATH=. python benchmarks/cache_memory.py [--cycles 200] [--every 20] [--model resnet18]

``--model mlp`` (default) is a small MLP; ``resnet18`` is torchvision's (random weights,
batch 2 at 64x64), a real model of 60 kernels.
"""
from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--model", choices=["mlp", "resnet18"], default="mlp")
    args = parser.parse_args()
    os.environ.setdefault("EMBER_CACHE_DIR", tempfile.mkdtemp(prefix="ember-cache-memory-"))
    import torch

    import ember
    from ember.backend.targets.cpp import build
    from ember.backend import compile as backend_compile

    if args.model == "resnet18":
        from ember.bench.compat import import_torchvision
        model, x = import_torchvision().models.resnet18().eval(), torch.randn(2, 3, 64, 64)
    else:
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                    torch.nn.LayerNorm(128), torch.nn.Linear(128, 10)).eval()
        x = torch.randn(32, 64)
    with torch.no_grad():
        want = model(x)
    print(f"cache {os.environ['EMBER_CACHE_DIR']}")
    print(f"{'cycle':>6} {'rss MB':>8} {'sources':>8} {'libraries':>9} {'s/cycle':>8}")
    start = time.perf_counter()
    for cycle in range(1, args.cycles + 1):
        with torch.no_grad():
            got = ember.compile(model)(x)
        torch.testing.assert_close(got, want)
        ember.reset()
        if cycle == 1 or cycle % args.every == 0:
            gc.collect()
            elapsed = (time.perf_counter() - start) / cycle
            print(f"{cycle:>6} {rss_mb():>8.1f} {len(backend_compile.generated_sources):>8} "
                  f"{len(build._loaded):>9} {elapsed:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
