"""Cold and warm start of one model on the GPU: run it twice, in two processes; the second
finds the graph cache and Triton's kernel cache (issue 7's target: a warm start under 1 s).
Each process runs the model eagerly first, so CUDA, cuDNN and cuBLAS are initialised before
Ember's first call is timed: that time is Ember's (compile or load, and one run).

    PYTHONPATH=. python3 benchmarks/warm_start.py resnet50
"""
import os
import subprocess
import sys
import tempfile
import time


def _child(name):
    import torch

    import ember
    from ember.bench import models
    ember.logs.set_logs("compile_time,perf_hints")
    model, inputs = models.build_model(name, "cuda", dtype=torch.bfloat16)[:2]
    with torch.no_grad():
        start = time.perf_counter()
        model(*inputs)
        torch.cuda.synchronize()
        eager = time.perf_counter() - start
        compiled = ember.compile(model)
        start = time.perf_counter()
        compiled(*inputs)
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        start = time.perf_counter()
        compiled(*inputs)
        torch.cuda.synchronize()
        second = time.perf_counter() - start
    print(f"{name}: compile and first call {first:.2f} s (second call {second * 1e3:.1f} ms; "
          f"eager's first call {eager:.2f} s)", flush=True)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        return _child(sys.argv[2])
    name = sys.argv[1] if len(sys.argv) > 1 else "resnet50"
    with tempfile.TemporaryDirectory() as caches:     # cold means empty caches
        # PYTHONPYCACHEPREFIX: where site-packages is read-only and ships no bytecode, each
        # process compiles every module it imports from source (the H200 machine: ~0.7 s of
        # Ember's first call); an installed machine has that bytecode, as both runs have here
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "EMBER_CACHE_DIR": caches + "/ember",
               "TRITON_CACHE_DIR": caches + "/triton", "PYTHONPYCACHEPREFIX": caches + "/pyc"}
        for label in ("cold", "warm"):
            print(label, end=": ", flush=True)
            subprocess.run([sys.executable, __file__, "--child", name], check=True, env=env)


if __name__ == "__main__":
    main()
