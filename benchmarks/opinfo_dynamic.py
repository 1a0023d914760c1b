"""OpInfo samples through torch.compile's frontend into Ember's backend, with static sizes and
with every size symbolic: issue 31's measure of the symbolic backend over a broad body of
operator programs (its pass rate must stay within 2 points of the static one).

    PYTHONPATH=. python benchmarks/opinfo_dynamic.py [--ops add,sum,...] [--full] [--k 2]
        [--cpu-backend cpp|triton] [--out report.md]

Each sample of each selected OpInfo (the CI quarter of op_db by default, as
``tests/backend/opinfo/``; ``--full``: every op) is compiled twice, by
``torch.compile(fn, backend=<Ember's backend>, dynamic=False)`` and by the same with
``dynamic=True``, and compared with eager (``opinfo_util.run_sample``: values, dtypes and the
inputs after the call). A sample *passes* unless the compiled result differs or the compiled
call raises where eager did not; samples eager rejects, or that need complex or sparse
tensors, are skipped in both. The report gives each frontend's pass rate, how the dynamic
samples compiled (one symbolic program, or per size where the symbolic path declined, with
the reasons counted), and the ops that fail only with symbolic sizes.
"""
from __future__ import annotations

import argparse
import collections
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "backend" / "opinfo"))
os.environ.setdefault("TRITON_INTERPRET", "1")      # before Triton defines any kernel

import torch  # noqa: E402

from ember.backend import compile_stats  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="", help="comma-separated OpInfo names (default: the "
                                                  "CI quarter of op_db)")
    parser.add_argument("--full", action="store_true", help="every op of op_db")
    parser.add_argument("--k", type=int, default=2, help="samples per (op, dtype); 0: all")
    parser.add_argument("--cpu-backend", default="cpp", choices=["cpp", "triton"])
    parser.add_argument("--out", default=None, help="also write the markdown report here")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.ops:
        os.environ["EMBER_OPINFO_OPS"] = args.ops
    if args.full:
        os.environ["EMBER_OPINFO_FULL"] = "1"
    os.environ["EMBER_OPINFO_K"] = str(args.k)
    import opinfo_util
    ops = opinfo_util.selected_ops()
    results = {"torch": [], "torch-dynamic": []}
    declines: collections.Counter = collections.Counter()
    start = time.perf_counter()
    for i, op in enumerate(ops):
        for frontend in results:
            outcomes = opinfo_util.run_op(op, cpu_backend=args.cpu_backend, frontend=frontend)
            results[frontend].extend(outcomes)
            if frontend == "torch-dynamic":
                declines.update(compile_stats.symbolic_declines)
        print(f"[{i + 1}/{len(ops)}] {opinfo_util.op_full_name(op)}", file=sys.stderr,
              flush=True)
    text = report(results, declines, args, len(ops), time.perf_counter() - start)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text)
    return 0


def _rate(outcomes) -> tuple[int, int, float]:
    ran = [o for o in outcomes if o.category != "skip"]
    passed = sum(o.category != "fail" for o in ran)
    return passed, len(ran), 100.0 * passed / max(len(ran), 1)


def report(results: dict, declines: collections.Counter, args, n_ops: int,
           seconds: float) -> str:
    lines = [f"# OpInfo through torch.compile into Ember's backend: static and symbolic sizes",
             "", f"torch {torch.__version__}; {n_ops} ops, {args.k or 'all'} samples per "
             f"(op, dtype); {args.cpu_backend} kernels; {seconds:.0f} s.", "",
             "| sizes | passed | ran | pass rate |", "|---|---|---|---|"]
    for frontend, outcomes in results.items():
        passed, ran, rate = _rate(outcomes)
        label = "static" if frontend == "torch" else "symbolic (dynamic=True)"
        lines.append(f"| {label} | {passed} | {ran} | {rate:.1f}% |")
    dynamic = results["torch-dynamic"]
    how = collections.Counter(o.symbolic or "no symbolic size" for o in dynamic
                              if o.category not in ("skip", "fail"))
    lines += ["", "Passing dynamic samples by how they compiled: " +
              ", ".join(f"{k} {v}" for k, v in how.most_common()) + "."]
    if declines:
        lines += ["", "Symbolic compiles declined (then compiled per size), by reason:", ""]
        lines += [f"- {n} x {reason}" for reason, n in declines.most_common(15)]
    static_fail = {(o.op, o.dtype, o.sample) for o in results["torch"] if o.category == "fail"}
    only = [o for o in dynamic if o.category == "fail"
            and (o.op, o.dtype, o.sample) not in static_fail]
    lines += ["", f"Samples that fail only with symbolic sizes: {len(only)}", ""]
    lines += [f"- {o.line()[:300]}" for o in only[:40]]
    both = [o for o in dynamic if o.category == "fail" and (o.op, o.dtype, o.sample)
            in static_fail]
    lines += ["", f"Samples that fail with both: {len(both)}", ""]
    lines += [f"- {o.line()[:300]}" for o in both[:20]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
