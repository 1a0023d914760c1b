"""Where an AMP training step's time goes, eager against Ember (and torch.compile), on the GPU.

For each variant: wall time per step (synchronised), host time per step (enqueue only, no
synchronisation: a step whose host time is close to its wall time is CPU-bound), the GPU's
busy time per step and its top kernels (``torch.profiler``). ``--cprofile`` adds the host's
Python profile of Ember's step; ``--layouts`` compiles Ember once per
``config.layout_optimization`` value (auto keeps training graphs NCHW).

    PYTHONPATH=. python3 benchmarks/train_profile.py resnet50 --layouts auto,channels_last
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import time

import torch
from torch.profiler import ProfilerActivity, profile

import ember
from ember import config
from ember.bench import zoo
from ember.bench.harness import _loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--layouts", default="auto")
    parser.add_argument("--torch-compile", action="store_true")
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of the script")
    args = parser.parse_args()
    fn, inputs = zoo.build_model(args.model, args.device, mode="train", amp=torch.bfloat16)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    activity = ProfilerActivity.CUDA if args.device == "cuda" else ProfilerActivity.CPU
    params = [p for p in fn.parameters() if p.requires_grad]

    def step(f):
        for p in params:
            p.grad = None
        _loss(f(*inputs)).backward()

    # (label, make the callable, Ember's layout): each Ember variant compiles and runs under
    # its own layout after a reset (the frontend's cache does not key on the option)
    variants = [("eager", lambda: fn, None)]
    variants += [(f"ember ({layout})", lambda: ember.compile(fn), layout)
                 for layout in args.layouts.split(",")]
    if args.torch_compile:
        variants.append(("torch.compile", lambda: torch.compile(fn), None))
    for label, make, layout in variants:
        with config.patch(layout_optimization=layout) if layout else contextlib.nullcontext():
            if layout:
                ember.reset()
            _measure(label, make(), step, sync, activity, args)


def _measure(label, f, step, sync, activity, args) -> None:
    """Wall, host and device time of ``step(f)``, its top kernels and (Ember) host profile."""
    for _ in range(3):
        step(f)
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        step(f)
    sync()
    wall = (time.perf_counter() - start) / args.steps * 1e3
    start = time.perf_counter()
    for _ in range(args.steps):
        step(f)
    host = (time.perf_counter() - start) / args.steps * 1e3
    sync()
    with profile(activities=[activity]) as prof:
        for _ in range(3):
            step(f)
        sync()
    events = prof.key_averages()
    busy = sum(_self_time(e, args.device) for e in events) / 3 / 1e3
    print(f"== {label}: wall {wall:.2f} ms/step, host {host:.2f} ms/step, GPU busy "
          f"{busy:.2f} ms/step", flush=True)
    totals: dict[str, list] = {}
    for e in events:
        entry = totals.setdefault(_category(e.key), [0.0, 0])
        entry[0] += _self_time(e, args.device) / 3 / 1e3
        entry[1] += e.count // 3
    print("   by kind: " + ", ".join(f"{k} {ms:.2f} ms/{n}" for k, (ms, n) in
                                     sorted(totals.items(), key=lambda kv: -kv[1][0])))
    top = sorted(events, key=lambda e: -_self_time(e, args.device))[:args.top]
    for e in top:
        print(f"   {_self_time(e, args.device) / 3 / 1e3:7.3f} ms  {e.count // 3:4d}x  "
              f"{e.key[:100]}")
    if args.cprofile and label.startswith("ember"):
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.steps):
            step(f)
        sync()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


_CATEGORIES = (  # (kind, substrings of the kernel's name), first match wins
    ("generated reduction", ("ember_red", "ember_per", "triton_red", "triton_per")),
    ("generated pointwise", ("ember_", "triton_")),
    ("layout copy", ("nchwToNhwc", "nhwcToNchw", "copy_kernel", "direct_copy")),
    ("conv wgrad", ("wgrad",)),
    ("conv dgrad", ("dgrad",)),
    ("conv", ("fprop", "conv", "cudnn", "implicit_gemm", "Convolution")),
    ("gemm", ("nvjet", "gemm", "cutlass")),
    ("batch norm (ATen)", ("batch_norm",)),
    ("other ATen", ("at::native",)),
)


def _category(name: str) -> str:
    for kind, needles in _CATEGORIES:
        if any(n in name for n in needles):
            return kind
    return "other"


def _self_time(event, device: str) -> float:
    """Microseconds ``event`` ran on the device (the host's for CPU runs)."""
    return event.self_device_time_total if device == "cuda" else event.self_cpu_time_total


if __name__ == "__main__":
    main()
