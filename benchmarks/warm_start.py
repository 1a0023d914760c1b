"""Cold and warm start of one model on the GPU: run it twice, in two processes; the second
finds the graph cache and Triton's kernel cache (issue 7's target: a warm start under 1 s).
Each process runs the model eagerly first, so CUDA, cuDNN and cuBLAS are initialised before
Ember's first call is timed: that time is Ember's (compile or load, and one run).

    PYTHONPATH=. python3 benchmarks/warm_start.py resnet50 [--profile]

``--profile``: the warm process's first call under cProfile (top functions by cumulative
time), to see what a warm start spends its second on.
"""
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import time


def _child(name, profile=False):
    import torch

    import ember
    from ember.bench import zoo
    ember.logs.set_logs("compile_time,perf_hints")
    model, inputs = zoo.build_model(name, "cuda", dtype=torch.bfloat16)[:2]
    with torch.no_grad():
        start = time.perf_counter()
        model(*inputs)
        torch.cuda.synchronize()
        eager = time.perf_counter() - start
        compiled = ember.compile(model)
        profiler = cProfile.Profile() if profile else None
        start = time.perf_counter()
        if profiler:
            profiler.enable()
        compiled(*inputs)
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        if profiler:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
        start = time.perf_counter()
        compiled(*inputs)
        torch.cuda.synchronize()
        second = time.perf_counter() - start
    print(f"{name}: compile and first call {first:.2f} s (second call {second * 1e3:.1f} ms; "
          f"eager's first call {eager:.2f} s)", flush=True)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        return _child(sys.argv[2], profile="--profile" in sys.argv)
    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    name = names[0] if names else "resnet50"
    profile = "--profile" in sys.argv
    with tempfile.TemporaryDirectory() as caches:     # cold means empty caches
        # PYTHONPYCACHEPREFIX: where site-packages is read-only and ships no bytecode, each
        # process compiles every module it imports from source (the GPU machine: ~0.5 s of
        # Ember's first call); an installed machine has that bytecode, as the warm run has
        # here: the cold one writes it (the GPU machine sets PYTHONDONTWRITEBYTECODE, which
        # left the prefix empty and the warm run compiling 63 modules from source)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "EMBER_CACHE_DIR": caches + "/ember",
               "TRITON_CACHE_DIR": caches + "/triton", "PYTHONPYCACHEPREFIX": caches + "/pyc"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        for label in ("cold", "warm"):
            print(label, end=": ", flush=True)
            subprocess.run([sys.executable, __file__, "--child", name] +
                           ["--profile"] * (profile and label == "warm"), check=True, env=env)


if __name__ == "__main__":
    main()
