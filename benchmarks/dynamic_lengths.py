"""Sequence lengths of a real model in one process: compiles, first-call time per new length,
and results against eager, with ``dynamic=None`` (automatic dynamic) beside ``dynamic=False``.

    python benchmarks/dynamic_lengths.py [--models bert_base,gpt2] [--lengths 7,33,128,500,512]
        [--device cpu|cuda] [--dtype float32|bfloat16] [--batch N]

Issue 31's measure: HF BERT-base and GPT-2 (the ``ember bench`` gpu-suite models, full
size) called at each length in turn. For each policy the table gives the graphs handed to
the backend over all lengths (``compiles``), the backend's own compiles behind them
(symbolic: once for every size; per size: where the symbolic path declined), the first
call's seconds at each length (compile included, from an empty on-disk cache), and the largest relative error against
eager over the lengths. A second call at each length is timed too (ms, median of 5).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

import torch

try:
    import ember
except ImportError:   # run from a checkout that is not pip-installed
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    import ember
from ember.backend import compile_stats
from ember.bench import zoo
from ember.testing import CompileCounter


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device, *args) -> tuple[object, float]:
    _sync(device)
    start = time.perf_counter()
    out = fn(*args)
    _sync(device)
    return out, time.perf_counter() - start


def _hidden(out) -> torch.Tensor:
    """The model's main output tensor (last hidden state or logits)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) or hasattr(out, "keys"):
        return next(v for v in out.values() if isinstance(v, torch.Tensor))
    return next(v for v in out if isinstance(v, torch.Tensor))


def _relative_error(got, expected) -> float:
    got, expected = _hidden(got).float(), _hidden(expected).float()
    return ((got - expected).norm() / expected.norm().clamp_min(1e-12)).item()


def run(name: str, lengths: list[int], device: torch.device, dtype, batch: int) -> list[dict]:
    model = zoo.build_model(name, device, dtype=dtype, batch_size=batch)[0].eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    inputs = {n: torch.randint(0, vocab, (batch, n), generator=gen).to(device)
              for n in lengths}
    rows = []
    with torch.no_grad():
        expected = {n: model(inputs[n]) for n in lengths}
        for policy in (None, False):
            ember.reset()
            compile_stats.reset()
            counter = CompileCounter("ember")
            compiled = ember.compile(model, backend=counter, dynamic=policy)
            firsts, steady, error = [], [], 0.0
            # cold compiles: each policy starts from an empty on-disk cache
            with tempfile.TemporaryDirectory() as cache:
                saved, os.environ["EMBER_CACHE_DIR"] = os.environ.get("EMBER_CACHE_DIR"), cache
                try:
                    for n in lengths:
                        out, seconds = _timed(compiled, device, inputs[n])
                        firsts.append(seconds)
                        error = max(error, _relative_error(out, expected[n]))
                        steady.append(statistics.median(
                            _timed(compiled, device, inputs[n])[1] for _ in range(5)) * 1e3)
                finally:
                    if saved is None:
                        del os.environ["EMBER_CACHE_DIR"]
                    else:
                        os.environ["EMBER_CACHE_DIR"] = saved
            rows.append({"model": name, "dynamic": policy, "compiles": counter.frame_count,
                         "symbolic": compile_stats.symbolic_compiles,
                         "per_size": compile_stats.size_specializations,
                         "first_call_s": firsts, "steady_ms": steady, "max_rel_error": error})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert_base,gpt2")
    parser.add_argument("--lengths", default="7,33,128,500,512")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {device}, {args.dtype}, batch {args.batch}, "
          f"lengths {lengths}")
    print("model      dynamic  compiles  symbolic  per-size  first call s per length"
          "                 steady ms per length            max rel error")
    for name in args.models.split(","):
        for r in run(name, lengths, device, dtype, args.batch):
            print(f"{r['model']:<10} {str(r['dynamic']):<8} {r['compiles']:>8}  "
                  f"{r['symbolic']:>8}  {r['per_size']:>8}  "
                  + " ".join(f"{s:6.2f}" for s in r["first_call_s"]) + "   "
                  + " ".join(f"{m:7.1f}" for m in r["steady_ms"])
                  + f"   {r['max_rel_error']:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
