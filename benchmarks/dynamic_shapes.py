"""Issue 31's measuring stick: the dynamic-shapes programs, each called at several sizes.

    python benchmarks/dynamic_shapes.py [--modes count,ember,torch] [--programs A,B,CATEGORY]
                                        [--target cpp|triton] [--device cpu|cuda]
                                        [--json PATH]

The programs and the compile counts torch.compile needs are the table in
``ember/bench/dynamic_programs.py``. Each program runs under each mode:

- ``count``: ``ember.compile`` with ``ember.testing.CompileCounter()`` as the backend (the
  graphs run as captured: Ember's frontend alone);
- ``ember``: ``ember.compile`` with the "ember" backend (``--target``: its C++ or Triton CPU
  code), counted by a CompileCounter wrapped around it;
- ``torch``: ``torch.compile`` with ``torch._dynamo.testing.CompileCounter``, for reference;
  a count that differs from the table's is flagged (``!= table N``).

A program passes when every call's result equals eager's (``ember.testing.same``, the
program's tolerances) and the mode compiled no more graphs than the table's torch.compile
count. Compiling runs strictly (``suppress_errors=False``, ``fallback_on_lowering_error=
False``): an internal error is reported as ``error``, not hidden by running eagerly. A
program that marks dims with an API Ember lacks (``ember.mark_dynamic``,
``ember.mark_static``) is ``skipped: needs ...`` under the Ember modes. Each program's
compiles are the graphs handed to the backend over all its calls (a graph break counts each
graph). The last lines are the summary: ``MODE: N/81 pass, C compiles``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys

import torch

if not torch.cuda.is_available():   # the Triton target runs its interpreter on CPU tensors
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import ember
except ImportError:   # run from a checkout that is not pip-installed
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    import ember
from ember import config
from ember.backend import compile_stats
from ember.bench.dynamic_programs import PROGRAMS, DynamicProgram, by_name
from ember.testing import CompileCounter, same

MODES = {"count": "ember (counting backend)", "ember": 'ember (backend="ember")',
         "torch": "torch.compile (counting backend)"}


@dataclasses.dataclass
class Outcome:
    status: str              # "pass", "fail", "error" or "skipped"
    compiles: int | None     # None when skipped
    detail: str = ""
    needs: tuple[str, ...] = ()   # when skipped: the Ember APIs it lacks
    # the "ember" backend's own compiles behind those graphs: compiled once for every size
    # ("symbolic") or once per concrete size ("per_size", where the symbolic path declined)
    backend: dict | None = None

    def cell(self, bar: int) -> str:
        if self.status == "skipped":
            return "skip"
        if self.status == "error":
            return f"ERROR {self.compiles}"
        text = f"{'pass' if self.status == 'pass' else 'FAIL'} {self.compiles}"
        return text + (f">{bar}" if self.compiles > bar else "")


def _clone(args: tuple) -> tuple:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _shapes(args: tuple) -> str:
    return ", ".join(str(tuple(a.shape)) for a in args if isinstance(a, torch.Tensor))


def check_program(prog: DynamicProgram, compiled, counter, mark=None) -> Outcome:
    """Call ``compiled`` on every input tuple of ``prog`` beside eager; ``counter``'s
    ``frame_count`` is the compiles; ``mark(tensor, Mark)`` applies a mark to an input."""
    eager = prog.make()
    for i, args in enumerate(prog.inputs()):
        expected = eager(*_clone(args))
        call_args = _clone(args)
        for m in prog.marks if mark else ():
            mark(call_args[m.arg], m)
        try:
            got = compiled(*call_args)
        except Exception as e:   # reported per program: one bug must not end the run
            return Outcome("error", counter.frame_count,
                           f"call {i} ({_shapes(args)}): {type(e).__name__}: {e}"[:300])
        if not same(expected, got, rtol=prog.rtol, atol=prog.atol):
            return Outcome("fail", counter.frame_count,
                           f"call {i} ({_shapes(args)}): result differs from eager")
    status = "pass" if counter.frame_count <= prog.torch_compiles else "fail"
    detail = "" if status == "pass" else (
        f"{counter.frame_count} compiles, torch.compile needs {prog.torch_compiles}")
    return Outcome(status, counter.frame_count, detail)


def _ember_mark(tensor: torch.Tensor, m) -> None:
    if m.kind == "dynamic":
        ember.mark_dynamic(tensor, m.dim, min=m.min, max=m.max)
    else:
        ember.mark_static(tensor, m.dim)


def run_ember(prog: DynamicProgram, backend_options: dict | None) -> Outcome:
    """Ember's frontend; ``backend_options`` None: graphs run as captured, else the "ember"
    backend with those options."""
    missing = [f"ember.{api}" for api in prog.needs if not hasattr(ember, api)]
    if missing:
        return Outcome("skipped", None, "needs " + ", ".join(missing), tuple(missing))
    ember.reset()
    if backend_options is None:
        counter = CompileCounter()
    else:
        from ember.backend_registry import ember_backend
        counter = CompileCounter(
            lambda gm, example_inputs: ember_backend(gm, example_inputs,
                                                     options=dict(backend_options)))
    compile_stats.reset()
    with config.patch(suppress_errors=False, fallback_on_lowering_error=False):
        compiled = ember.compile(prog.make(), backend=counter, dynamic=prog.dynamic)
        outcome = check_program(prog, compiled, counter, _ember_mark)
    if backend_options is not None:
        outcome.backend = {"symbolic": compile_stats.symbolic_compiles,
                           "per_size": compile_stats.size_specializations}
    return outcome


def run_torch(prog: DynamicProgram) -> Outcome:
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter as TorchCompileCounter

    def mark(tensor, m):
        if m.kind == "dynamic":
            torch._dynamo.mark_dynamic(tensor, m.dim, min=m.min, max=m.max)
        else:
            torch._dynamo.mark_static(tensor, m.dim)

    torch._dynamo.reset()
    counter = TorchCompileCounter()
    compiled = torch.compile(prog.make(), backend=counter, dynamic=prog.dynamic)
    outcome = check_program(prog, compiled, counter, mark)
    if outcome.compiles != prog.torch_compiles:
        outcome.detail = (outcome.detail + "; " if outcome.detail else "") + (
            f"!= table {prog.torch_compiles}")
    torch._dynamo.reset()
    return outcome


def run_program(prog: DynamicProgram, modes: list[str], target: str) -> dict[str, Outcome]:
    options = {"cpu_backend": target} if target != "cpp" else {}
    return {mode: run_torch(prog) if mode == "torch" else
            run_ember(prog, None if mode == "count" else options) for mode in modes}


def summarize(programs, modes, results) -> dict[str, dict]:
    summary = {}
    for mode in modes:
        outs = [results[p.name][mode] for p in programs]
        skipped = [o for o in outs if o.status == "skipped"]
        summary[mode] = {
            "label": MODES[mode], "total": len(outs),
            "passed": sum(o.status == "pass" for o in outs),
            "compiles": sum(o.compiles for o in outs if o.compiles is not None),
            "skipped": len(skipped),
            "skipped_needs": sorted({api for o in skipped for api in o.needs}),
            "errors": sum(o.status == "error" for o in outs)}
        backend = [o.backend for o in outs if o.backend is not None]
        if backend:
            summary[mode]["backend"] = {k: sum(b[k] for b in backend)
                                        for k in ("symbolic", "per_size")}
    return summary


def summary_line(s: dict) -> str:
    line = f"{s['label']}: {s['passed']}/{s['total']} pass, {s['compiles']} compiles"
    extras = []
    if s["skipped"]:
        extras.append(f"{s['skipped']} skipped: needs {', '.join(s['skipped_needs'])}")
    if s["errors"]:
        extras.append(f"{s['errors']} errors")
    if "backend" in s:
        extras.append(f"behind them {s['backend']['symbolic']} symbolic compiles and "
                      f"{s['backend']['per_size']} per-size compiles")
    return line + (f" ({', '.join(extras)})" if extras else "")


def print_header(width: int, modes: list[str]) -> None:
    print(f"{'program':<{width}}  {'category':<12} {'dynamic':<7} {'table':>5}  "
          + "  ".join(f"{m:<10}" for m in modes) + "  notes", flush=True)


def print_row(width: int, prog: DynamicProgram, modes: list[str], row: dict) -> None:
    marks = " ".join(f"mark_{m.kind}({m.arg},{m.dim})" for m in prog.marks)
    notes = "; ".join(f"{m}: {row[m].detail}" for m in modes if row[m].detail)
    print(f"{prog.name:<{width}}  {prog.category:<12} {str(prog.dynamic):<7} "
          f"{prog.torch_compiles:>5}  "
          + "  ".join(f"{row[m].cell(prog.torch_compiles):<10}" for m in modes)
          + "  " + " ".join(x for x in (marks, notes) if x), flush=True)


def to_json(programs, modes, results, summary) -> dict:
    return {
        "torch_version": torch.__version__,
        "programs": [{
            "name": p.name, "category": p.category, "dynamic": p.dynamic,
            "marks": [dataclasses.asdict(m) for m in p.marks],
            "calls": [_shapes(args) for args in p.inputs()],
            "torch_compiles_table": p.torch_compiles,
            "results": {m: dataclasses.asdict(results[p.name][m]) for m in modes},
        } for p in programs],
        "summary": summary,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="count,ember,torch",
                        help="comma-separated, of: " + ", ".join(MODES))
    parser.add_argument("--programs", default="",
                        help="comma-separated program names or categories (default: all)")
    parser.add_argument("--target", choices=("cpp", "triton"), default="cpp",
                        help='CPU code the "ember" mode generates (default cpp)')
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the programs run: cuda makes every tensor (inputs, "
                             "parameters, tensors the programs create) there, and the ember "
                             "mode generates Triton for the GPU (--target is for the CPU)")
    parser.add_argument("--json", help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        parser.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    names = [n for n in args.programs.split(",") if n]
    try:
        programs = by_name(names) if names else list(PROGRAMS)
    except KeyError as e:
        parser.error(str(e))
    width = max(len(p.name) for p in programs)
    print_header(width, modes)
    results = {}
    for prog in programs:
        with torch.device(args.device):      # the default device of every tensor made
            results[prog.name] = run_program(prog, modes, args.target)
        print_row(width, prog, modes, results[prog.name])
    summary = summarize(programs, modes, results)
    print()
    for mode in modes:
        print(summary_line(summary[mode]))
    if args.json:
        pathlib.Path(args.json).write_text(
            json.dumps(to_json(programs, modes, results, summary), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
