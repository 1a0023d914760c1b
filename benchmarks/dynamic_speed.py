"""Speed of one dynamic compile against static compiles, per model, in one process.

    python benchmarks/dynamic_speed.py [--models mlp,convnet,transformer_block,tiny_gpt]
        [--dim batch|seq] [--sizes N,N,N] [--device cpu|cuda] [--dtype float32|bfloat16]
        [--rounds 7] [--calls 10] [--threads N] [--json PATH]

Issue 31's speed measure ("dynamic kernels within 10% of static ones"). For each model
(``ember bench``'s zoo: the ``builtin`` suite by default; ``--models resnet50`` or
``bert_base`` on the GPU) and each size of the dynamic dim (``--dim batch``: the inputs'
dim 0; ``seq``: dim 1, the sequence length of token ids or of a (batch, seq, hidden)
input):

- *static*: ``ember.compile(model, dynamic=False)``, one compiled object per size, so each
  size runs its own static program with a single guarded entry;
- *dynamic*: one ``ember.compile(model, dynamic=False)`` whose inputs have the dim marked
  with ``ember.mark_dynamic``: one program with symbolic sizes serves every size (the
  backend's symbolic compiles and per-size compiles behind it are counted).

Both are compiled and checked against eager first; then steady-state calls are timed
interleaved (static, dynamic, static, ...; ``--rounds`` rounds of ``--calls`` calls each,
each call timed, synchronised on CUDA), and the table gives each one's median of the
rounds' median calls in milliseconds and the ratio dynamic / static (above 1: the dynamic
program is slower; the median of the rounds' ratios, each of a pair timed back to back),
with the geometric mean over the sizes per model. On a shared CPU the medians are noisy (a kernel's OpenMP threads descheduled
by other processes): the fastest call of each (``min``) and their ratio are shown beside
them, and ``--threads`` sets the threads kernels and ATen use.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys
import time

import torch

try:
    import ember
except ImportError:   # run from a checkout that is not pip-installed
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    import ember
from ember.backend import compile_stats
from ember.bench import zoo

DIMS = {"batch": 0, "seq": 1}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _resized(t, dim: int, n: int, gen: torch.Generator):
    """``t`` with ``n`` along ``dim``: fresh values of its kind (token ids below its
    largest, or normal floats); other inputs (and tensors without the dim) as they are."""
    if not isinstance(t, torch.Tensor) or t.dim() <= dim:
        return t
    shape = list(t.shape)
    shape[dim] = n
    if t.is_floating_point():
        return torch.randn(shape, generator=gen).to(device=t.device, dtype=t.dtype)
    high = max(int(t.max()) + 1, 1) if t.numel() else 1
    return torch.randint(0, high, shape, generator=gen).to(device=t.device, dtype=t.dtype)


def default_sizes(example, dim: int) -> list[int]:
    """The example's size, and two below it: one odd-sized (a ragged last batch, a length
    no block divides)."""
    full = next(t.shape[dim] for t in example if isinstance(t, torch.Tensor) and t.dim() > dim)
    return sorted({full, max(2, full // 2 + 1), max(2, 3 * full // 4 - 1)}, reverse=True)


def _outputs(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = list(out.values())
    return [t for t in (out if isinstance(out, (list, tuple)) else []) if
            isinstance(t, torch.Tensor)]


def _relative_error(got, expected) -> float:
    worst = 0.0
    for g, e in zip(_outputs(got), _outputs(expected)):
        g, e = g.float(), e.float()
        worst = max(worst, ((g - e).norm() / e.norm().clamp_min(1e-12)).item())
    return worst


def _time(fn, inputs, calls: int, device) -> list[float]:
    """Milliseconds of each of ``calls`` calls."""
    out = []
    for _ in range(calls):
        _sync(device)
        start = time.perf_counter()
        fn(*inputs)
        _sync(device)
        out.append((time.perf_counter() - start) * 1e3)
    return out


def run_model(name: str, dim: int, sizes: list[int] | None, device: torch.device, dtype,
              rounds: int, calls: int) -> list[dict]:
    model, example = zoo.build_model(name, device, dtype=dtype)
    model = model.eval()
    sizes = sizes or default_sizes(example, dim)
    gen = torch.Generator().manual_seed(0)
    inputs = {n: tuple(_resized(t, dim, n, gen) for t in example) for n in sizes}
    rows = []
    with torch.no_grad():
        expected = {n: model(*inputs[n]) for n in sizes}
        static = {}
        for n in sizes:
            static[n] = ember.compile(model, dynamic=False)
            static[n](*inputs[n])
        before = (compile_stats.symbolic_compiles, compile_stats.size_specializations)
        dynamic = ember.compile(model, dynamic=False)
        marked = {}
        for n in sizes:
            marked[n] = tuple(t.clone() if isinstance(t, torch.Tensor) else t
                              for t in inputs[n])
            for t in marked[n]:
                if isinstance(t, torch.Tensor) and t.dim() > dim:
                    ember.mark_dynamic(t, dim)
            dynamic(*marked[n])
        symbolic = compile_stats.symbolic_compiles - before[0]
        per_size = compile_stats.size_specializations - before[1]
        for n in sizes:
            times = {"static": [], "dynamic": []}     # per round: the median call
            fastest = {"static": math.inf, "dynamic": math.inf}
            errors = {"static": _relative_error(static[n](*inputs[n]), expected[n]),
                      "dynamic": _relative_error(dynamic(*marked[n]), expected[n])}
            _time(static[n], inputs[n], calls, device)      # warm: allocator, caches
            _time(dynamic, marked[n], calls, device)
            for _ in range(rounds):
                for kind, fn, args in (("static", static[n], inputs[n]),
                                       ("dynamic", dynamic, marked[n])):
                    calls_ms = _time(fn, args, calls, device)
                    times[kind].append(statistics.median(calls_ms))
                    fastest[kind] = min(fastest[kind], *calls_ms)
            s_ms, d_ms = (statistics.median(times[k]) for k in ("static", "dynamic"))
            # each round's pair measured back to back: their ratio drifts less than the
            # medians' with the machine's load
            ratio = statistics.median(d / s for s, d in zip(times["static"], times["dynamic"]))
            rows.append({"model": name, "size": n, "static_ms": s_ms, "dynamic_ms": d_ms,
                         "ratio": ratio, "static_min_ms": fastest["static"],
                         "dynamic_min_ms": fastest["dynamic"],
                         "min_ratio": fastest["dynamic"] / fastest["static"],
                         "symbolic_compiles": symbolic,
                         "per_size_compiles": per_size,
                         "max_rel_error": max(errors.values())})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(zoo.in_suite("builtin")))
    parser.add_argument("--dim", choices=tuple(DIMS), default="batch",
                        help="the dim marked dynamic: batch (dim 0) or seq (dim 1)")
    parser.add_argument("--sizes", default="",
                        help="comma-separated sizes of that dim (default: the model's "
                             "example size and two below it)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="", choices=("", "float32", "bfloat16"),
                        help="default: each model's own (float32, bfloat16 for the gpu suite)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10, help="calls timed per round")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads (default: torch's own)")
    parser.add_argument("--json", help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [n for n in args.models.split(",") if n]
    try:
        zoo.check_names(names)
    except Exception as e:   # an unknown model or a missing package: said, not a traceback
        parser.error(str(e))
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    sizes = [int(s) for s in args.sizes.split(",") if s] or None
    print(f"torch {torch.__version__}, {device}, dtype {args.dtype or 'per model'}, dynamic "
          f"dim {args.dim}, {torch.get_num_threads()} threads; median (and min) of "
          f"{args.rounds} rounds x {args.calls} calls, interleaved")
    print(f"{'model':<18} {'size':>5} {'static ms':>10} {'dynamic ms':>11} {'ratio':>6}  "
          f"{'min: static':>11} {'dynamic':>8} {'ratio':>6}  compiles (symbolic/per-size)  "
          f"max rel error")
    rows = []
    for name in names:
        model_rows = run_model(name, DIMS[args.dim], sizes, device, dtype, args.rounds,
                               args.calls)
        for r in model_rows:
            print(f"{r['model']:<18} {r['size']:>5} {r['static_ms']:>10.3f} "
                  f"{r['dynamic_ms']:>11.3f} {r['ratio']:>6.3f}  "
                  f"{r['static_min_ms']:>11.3f} {r['dynamic_min_ms']:>8.3f} "
                  f"{r['min_ratio']:>6.3f}  "
                  f"{r['symbolic_compiles']:>4} / {r['per_size_compiles']:<21}"
                  f"{r['max_rel_error']:.1e}", flush=True)
        geo, geo_min = (math.exp(statistics.mean(math.log(r[k]) for r in model_rows))
                        for k in ("ratio", "min_ratio"))
        print(f"{name:<18} {'all':>5} {'':>10} {'':>11} {geo:>6.3f}  {'':>11} {'':>8} "
              f"{geo_min:>6.3f}  (geometric means)", flush=True)
        rows += model_rows
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
