"""Where a compiled model's GPU time goes: eager vs Ember, and Ember's top CUDA kernels.

    python benchmarks/profile_models.py resnet50,bert_base [--layout auto|channels_last|off]
        [--mode reduce-overhead] [--rows 10] [--eager] [--dtype bfloat16]

Models come from the bench zoo (``ember/bench/zoo/``) at their default batch, in
bfloat16 as the GPU library runs measure them (``--dtype float32``: the zoo's own dtype).
Times are CUDA-event medians of 10 calls; the table is torch.profiler's, sorted by CUDA time
over 3 calls (``--eager``: eager's table too, to set a model Ember loses on beside it).
``EMBER_LOGS=perf_hints`` adds the compiler's decisions (CUDA graph capture,
layout, autotuning).
"""
from __future__ import annotations

import argparse
import statistics

import torch

import ember
from ember import config
from ember.backend import compile_stats
from ember.bench import zoo


def median_ms(fn, *args, n: int = 10) -> float:
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models")
    parser.add_argument("--layout", default="auto", choices=["auto", "channels_last", "off"])
    parser.add_argument("--mode", default=None)
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--eager", action="store_true", help="profile eager's calls too")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    from torch.profiler import ProfilerActivity, profile
    for name in args.models.split(","):
        model, inputs = zoo.build_model(name, "cuda", dtype=dtype)[:2]
        with torch.no_grad(), config.patch(layout_optimization=args.layout):
            ember.reset()
            compile_stats.reset()
            compiled = ember.compile(model, mode=args.mode)
            compiled(*inputs)
            print(f"{name}: eager {median_ms(model, *inputs):.2f} ms, ember "
                  f"{median_ms(compiled, *inputs):.2f} ms; kernels "
                  f"{compile_stats.generated_kernel_count}, "
                  f"library {dict(compile_stats.extern_calls)}, "
                  f"fallbacks {dict(compile_stats.fallback_ops)}")
            for label, fn in [("ember", compiled)] + [("eager", model)] * args.eager:
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        fn(*inputs)
                    torch.cuda.synchronize()
                print(f"{name}, {label}, 3 calls:")
                print(prof.key_averages().table(sort_by="cuda_time_total",
                                                row_limit=args.rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
