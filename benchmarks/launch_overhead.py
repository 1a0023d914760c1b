"""Per-call cost of a compiled one-kernel function on the GPU, and of its kernel launch alone
(issue 7's launch target: at most 5 us). CPU-bound: a tiny tensor, many calls.

    PYTHONPATH=. python3 benchmarks/launch_overhead.py
"""
import gc
import time

import torch

import ember


def per_call_us(fn, *args, n=20000):
    for _ in range(100):
        fn(*args)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e6


def main():
    x = torch.randn(1024, device="cuda")

    def one(x):
        return (x * 2 + 1).relu()
    with torch.no_grad():
        compiled, inductor = ember.compile(one), torch.compile(one)
        print(f"one fused kernel: eager (2 launches) {per_call_us(one, x):.1f} us, ember "
              f"{per_call_us(compiled, x):.1f} us, torch.compile {per_call_us(inductor, x):.1f} "
              f"us per call")
        launcher = [o for o in gc.get_objects() if type(o).__name__ == "TritonLauncher"][-1]
        out = torch.empty_like(x)
        print(f"TritonLauncher call {per_call_us(launcher, x, out):.1f} us; its direct launch "
              f"{per_call_us(launcher.fast, x, out):.1f} us")


if __name__ == "__main__":
    main()
