"""Depthwise convolutions generated as stencils against the library's (issue 34), in one
process: each model's bfloat16 inference on CUDA, eager and Ember once per value of
``TritonTarget.max_generated_depthwise_taps`` (0: every depthwise convolution is the
library's), timed alternating (median ms and host ms of ``--iters`` rounds), with each Ember
variant's GPU busy time, launches and relative error against eager.

    PYTHONPATH=. python3 benchmarks/depthwise_stencil.py [--models maxvit_tiny_rw_224,...] \\
        [--taps 0,25,49] [--iters 20]

Why one process: separate processes measured eager itself 13% apart on the same H100
(maxvit), which hid what the stencils changed. The graph cache is off, so each variant is
compiled under its own policy.
"""
from __future__ import annotations

import argparse
import os

os.environ["EMBER_GRAPH_CACHE"] = "0"

import torch  # noqa: E402

import ember  # noqa: E402
from benchmarks.profile_models import kernel_profile  # noqa: E402
from ember.backend.targets.triton.target import TritonTarget  # noqa: E402
from ember.bench import harness, zoo  # noqa: E402


def measure(name: str, taps: list[int], iters: int) -> None:
    model, inputs = zoo.build_model(name, "cuda", dtype=torch.bfloat16)
    calls = {"eager": model}
    with torch.no_grad():
        expected = model(*inputs)
        for n in taps:
            TritonTarget.max_generated_depthwise_taps = n
            compiled = ember.compile(model, backend="ember")
            out = compiled(*inputs)           # compiled here, under this policy
            err = ((out.float() - expected.float()).norm() / expected.float().norm()).item()
            _, launches, busy = kernel_profile(compiled, inputs, torch.device("cuda"), 5, 1)
            print(f"{name} taps<={n}: launches {launches:.0f}, GPU busy {busy:.3f} ms, "
                  f"rel. error vs eager {err:.1e}", flush=True)
            calls[f"ember taps<={n}"] = compiled
        times = harness.time_calls({k: (lambda f=f: f(*inputs)) for k, f in calls.items()},
                                   torch.device("cuda"), iters, 3)
    for k, (ms, host) in times.items():
        print(f"{name} {k}: {ms:.3f} ms, host {host:.3f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="maxvit_tiny_rw_224,mobilenetv3_large_100,"
                                            "efficientnet_b0,convnext_tiny")
    parser.add_argument("--taps", default="0,25,49")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    taps = [int(t) for t in args.taps.split(",")]
    for name in args.models.split(","):
        try:
            measure(name, taps, args.iters)
        except Exception as e:     # one model's failure (out of memory) leaves the others
            print(f"{name}: failed: {type(e).__name__}: {e}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
