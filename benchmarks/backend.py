"""Ember's backend against eager and torch.compile on kernels and models, on CPU, in one process.

    python benchmarks/backend.py [--rows pointwise,softmax,layer_norm,mlp,resnet18]
                                 [--iters 20] [--warmup 3] [--threads N] [--small]
                                 [--no-torch-compile] [--no-compile-times]
                                 [--compile-rows ROWS] [--compile-timeout S]
                                 [--torch-compile-budget S] [--json PATH]

Rows (inference only, under ``torch.no_grad()``, float32):

- ``pointwise``: a 10-op chain ``tanh(relu(sin(x*2+1)*y) / (1+exp(z))) - 0.5`` over three
  tensors of 1,000,000 elements: one fused loop against ten passes over memory.
- ``softmax``: ``torch.softmax(x, -1)``, x of (4096, 1024).
- ``layer_norm``: ``F.layer_norm`` over the last dim of (4096, 1024), with weight and bias.
- ``mlp``: the built-in ``mlp`` of ``ember.bench.zoo`` (4 x Linear 512 + GELU, batch 64).
- ``resnet18``: timm resnet18 from the same registry (1 x 3x128x128); skipped with a note
  when timm is not installed.

Speed table: eager, Ember (``ember.compile(fn, backend="ember")``) and torch.compile (inductor,
the peer; DESIGN.md §4 lets only the benchmark harness and tests call it) are timed in
alternating rounds (eager, ember, torch.compile, eager, ...) so a slow spell of the machine
hits all three alike; each time is the median of ``--iters`` calls after ``--warmup``
untimed ones (``ember.bench.harness._time_side_by_side``). ``eager/ember`` and
``torch.compile/ember`` above 1 mean Ember is faster. ``ember err`` / ``tc err``: the largest
absolute difference from eager's output.

Compile-time table: the wall time of the first call (capture + compile + run) of each
compiler, each measured in a fresh Python process (this script re-run with ``--_child``) so
nothing cached in this process helps. Imports (torch, ember, the model) happen before the
clock starts, and so does ``torch._dynamo`` (``torch.compile(fn)`` imports it before the
call; Ember's first call would import it lazily); torch.compile's lazy imports of inductor
are part of its first call, as they are for a user. Per row, one fresh temporary directory holds both on-disk caches
(``EMBER_CACHE_DIR`` for Ember's kernel cache, ``TORCHINDUCTOR_CACHE_DIR`` for inductor's
FX-graph, AOT and C++ caches): "cold" is the first process on the empty directory, "warm" a
second process reusing it. A cold torch.compile takes 10-20 s per row on a 2-core CPU.

``--small`` divides the synthetic rows' sizes by 16 (and the mlp batch, 64 -> 4) for tests;
resnet18 is unchanged.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import torch

try:
    import ember
except ImportError:   # run from a checkout that is not pip-installed
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    import ember
import ember.frontend.convert  # noqa: F401  imported now so first calls exclude module imports
from ember.bench import harness, kernels, zoo
from ember.bench.report import fmt_err, fmt_ms, fmt_ratio, render_table

SCRIPT = pathlib.Path(__file__).resolve()
SMALL_FACTOR = 16


# --------------------------------------------------------------------------------- the rows

# The same three programs as ``ember bench --suite kernels`` (which reports them in GB/s).
pointwise, softmax, layer_norm = kernels.pointwise, kernels.softmax, kernels.layer_norm


def _seeded(build: Callable[[], tuple[Callable, tuple]]) -> tuple[Callable, tuple]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build()


def _build_pointwise(small: bool):
    n = 1_000_000 // (SMALL_FACTOR if small else 1)
    return _seeded(lambda: (pointwise, tuple(torch.randn(n) for _ in range(3))))


def _build_softmax(small: bool):
    rows = 4096 // (SMALL_FACTOR if small else 1)
    return _seeded(lambda: (softmax, (torch.randn(rows, 1024),)))


def _build_layer_norm(small: bool):
    rows = 4096 // (SMALL_FACTOR if small else 1)
    return _seeded(lambda: (layer_norm, (torch.randn(rows, 1024), torch.randn(1024),
                                         torch.randn(1024))))


def _build_zoo(name: str):
    def build(small: bool):
        model, inputs = zoo.build_model(name, "cpu")
        if small and name == "mlp":
            inputs = (inputs[0][:64 // SMALL_FACTOR].contiguous(),)
        return model, inputs
    return build


@dataclasses.dataclass(frozen=True)
class RowSpec:
    name: str
    description: str
    build: Callable[[bool], tuple[Callable, tuple]]   # build(small) -> (fn or module, inputs)
    zoo_name: str | None = None                        # ember.bench.zoo name, if any

    def unavailable(self) -> str | None:
        """Why this row cannot run here (a missing optional package), or None."""
        if self.zoo_name is None or zoo.is_available(self.zoo_name):
            return None
        return (f"skipped: needs the {zoo.MODELS[self.zoo_name].requires!r} package "
                f"(pip install -e '.[bench]')")


ROWS: dict[str, RowSpec] = {spec.name: spec for spec in [
    RowSpec("pointwise", "10-op pointwise chain, 3 x 1M float32", _build_pointwise),
    RowSpec("softmax", "softmax(x, -1), x (4096, 1024)", _build_softmax),
    RowSpec("layer_norm", "layer_norm over (4096, 1024) + weight, bias", _build_layer_norm),
    RowSpec("mlp", "zoo mlp: 4 x (Linear 512 + GELU), batch 64", _build_zoo("mlp"), "mlp"),
    RowSpec("resnet18", "zoo timm resnet18, 1 x 3x128x128", _build_zoo("resnet18"),
            "resnet18"),
]}


# ------------------------------------------------------------------------------ speed table

@dataclasses.dataclass
class SpeedRow:
    row: str
    description: str
    eager_ms: float | None = None
    ember_ms: float | None = None
    torch_compile_ms: float | None = None
    ember_err: float | None = None           # max |ember - eager|
    torch_compile_err: float | None = None   # max |torch.compile - eager|
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def eager_over_ember(self) -> float | None:
        return harness._ratio(self.eager_ms, self.ember_ms)

    @property
    def torch_compile_over_ember(self) -> float | None:
        return harness._ratio(self.torch_compile_ms, self.ember_ms)

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "eager_over_ember": self.eager_over_ember,
                "torch_compile_over_ember": self.torch_compile_over_ember}



def measure_speed(spec: RowSpec, *, small: bool, iters: int, warmup: int,
                  with_torch_compile: bool, torch_compile_budget_s: float | None) -> SpeedRow:
    row = SpeedRow(spec.name, spec.description)
    skip = spec.unavailable()
    if skip:
        row.notes.append(skip)
        return row
    fn, inputs = spec.build(small)
    with torch.no_grad():
        expected = fn(*inputs)
        variants: dict[str, Callable] = {"eager": fn}

        ember.reset()
        try:
            compiled = ember.compile(fn, backend="ember")
            row.ember_err = harness.max_abs_error(compiled(*inputs), expected)
            variants["ember"] = compiled
        except Exception as e:   # report, keep benchmarking the other rows
            row.notes.append(f"ember failed: {harness._one_line(e)}")

        if with_torch_compile:
            peer = harness.compile_peer(fn, inputs, torch.device("cpu"),
                                        torch_compile_budget_s, row.notes)
            if peer is not None:
                variants["torch.compile"], _, out = peer
                row.torch_compile_err = harness.max_abs_error(out, expected)

        times = harness._time_side_by_side(variants, inputs, torch.device("cpu"), iters, warmup)
    return harness.finish_row(row, times, with_torch_compile)


# ----------------------------------------------------------------------- compile-time table

COMPILERS = ("ember", "torch.compile")


@dataclasses.dataclass
class CompileRow:
    row: str
    # seconds of the first call in a fresh process, keyed "ember cold", "ember warm", ...
    first_call_s: dict[str, float | None] = dataclasses.field(default_factory=dict)
    # the whole child process, start to exit, as seen from here (imports included)
    process_s: dict[str, float | None] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def measure_compile_times(spec: RowSpec, compilers: list[str], *, small: bool,
                          threads: int | None, timeout_s: float) -> CompileRow:
    """Cold, then warm, first-call times of each compiler, each in its own fresh process."""
    row = CompileRow(spec.name)
    skip = spec.unavailable()
    if skip:
        row.notes.append(skip)
        return row
    with tempfile.TemporaryDirectory(prefix=f"ember-bench-{spec.name}-") as root:
        env = {**os.environ,
               "EMBER_CACHE_DIR": os.path.join(root, "ember"),
               "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor")}
        for compiler in compilers:
            for phase in ("cold", "warm"):
                key = f"{compiler} {phase}"
                row.first_call_s[key] = row.process_s[key] = None
                cmd = [sys.executable, str(SCRIPT), "--_child", f"{spec.name}:{compiler}"]
                cmd += ["--small"] if small else []
                cmd += ["--threads", str(threads)] if threads else []
                start = time.perf_counter()
                try:
                    done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                          timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    row.notes.append(f"{key}: ran past {timeout_s:g} s")
                    break   # warm would be as long: skip it
                row.process_s[key] = time.perf_counter() - start
                result = _child_result(done.stdout)
                if done.returncode != 0 or result is None or "error" in result:
                    why = (result or {}).get("error") or _last_line(done.stderr) or \
                        f"exit status {done.returncode}"
                    row.notes.append(f"{key} failed: {why}")
                    break
                row.first_call_s[key] = result["first_call_s"]
    return row


def _child_result(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def child_main(target: str, small: bool) -> int:
    """In a fresh process: build the row, time one compiled first call, print JSON."""
    name, compiler = target.split(":", 1)
    spec = ROWS[name]
    try:
        fn, inputs = spec.build(small)
        # torch.compile(fn) imports torch._dynamo before the clock starts; Ember's first call
        # would import it lazily (fake tensors reach torch._disable_dynamo), so import it
        # here for both: the table compares compiling, not that one import (2-5 s here).
        import torch._dynamo  # noqa: F401
        with torch.no_grad():
            compiled = (ember.compile(fn, backend="ember") if compiler == "ember"
                        else torch.compile(fn))
            start = time.perf_counter()
            compiled(*inputs)
            first_call_s = time.perf_counter() - start
        print(json.dumps({"row": name, "compiler": compiler, "first_call_s": first_call_s}))
    except Exception as e:
        print(json.dumps({"row": name, "compiler": compiler,
                          "error": harness._one_line(e)}))
        return 1
    return 0


# ---------------------------------------------------------------------------------- output

SPEED_COLUMNS = ("row", "eager ms", "ember ms", "torch.compile ms", "eager/ember",
                 "torch.compile/ember", "ember err", "tc err")


def speed_cells(row: SpeedRow) -> tuple[str, ...]:
    return (row.row, fmt_ms(row.eager_ms), fmt_ms(row.ember_ms), fmt_ms(row.torch_compile_ms),
            fmt_ratio(row.eager_over_ember), fmt_ratio(row.torch_compile_over_ember),
            fmt_err(row.ember_err), fmt_err(row.torch_compile_err))


def compile_columns(compilers: list[str]) -> tuple[str, ...]:
    return ("row", *(f"{c} {phase} s" for c in compilers for phase in ("cold", "warm")))


def compile_cells(row: CompileRow, compilers: list[str]) -> tuple[str, ...]:
    return (row.row, *(_s(row.first_call_s.get(f"{c} {phase}"))
                       for c in compilers for phase in ("cold", "warm")))


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


# ------------------------------------------------------------------------------------ main

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="benchmarks/backend.py",
        description="Eager vs Ember vs torch.compile on kernels and models (CPU), plus cold "
                    "and warm compile times in fresh processes.")
    parser.add_argument("--rows", default=",".join(ROWS),
                        help=f"comma-separated rows (default: all; known: {', '.join(ROWS)})")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per variant")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per variant")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch.set_num_threads(N), here and in the compile-time "
                             "processes (default: torch's choice)")
    parser.add_argument("--small", action="store_true",
                        help=f"divide the synthetic rows' sizes by {SMALL_FACTOR} (tests)")
    parser.add_argument("--no-torch-compile", dest="torch_compile", action="store_false",
                        help="do not measure torch.compile (speed nor compile time)")
    parser.add_argument("--torch-compile-budget", type=float, default=180.0, metavar="S",
                        help="in-process: give up on torch.compile for a row whose first "
                             "call takes over S seconds (default 180)")
    parser.add_argument("--no-compile-times", dest="compile_times", action="store_false",
                        help="skip the cold/warm compile-time table")
    parser.add_argument("--compile-rows", default=None,
                        help="rows of the compile-time table (default: those of --rows)")
    parser.add_argument("--compile-timeout", type=float, default=300.0, metavar="S",
                        help="limit for each compile-time process (default 300)")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    parser.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    return parser


def _parse_rows(parser, text: str, flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown or not names:
        parser.error(f"{flag}: unknown row(s) {', '.join(unknown) or '(none given)'}; "
                     f"known: {', '.join(ROWS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    if args._child:
        return child_main(args._child, args.small)
    if args.iters < 1 or args.warmup < 0:
        parser.error("--iters must be >= 1 and --warmup >= 0")
    names = _parse_rows(parser, args.rows, "--rows")
    compile_names = (_parse_rows(parser, args.compile_rows, "--compile-rows")
                     if args.compile_rows else names)
    compilers = list(COMPILERS if args.torch_compile else COMPILERS[:1])

    print(f"# torch {torch.__version__}, cpu, {torch.get_num_threads()} threads, "
          f"median of {args.iters} calls after {args.warmup} warm-up, alternating; "
          f"{'small sizes' if args.small else 'full sizes'}", flush=True)
    speed_rows = []
    for name in names:
        print(f"# {name} ...", file=sys.stderr, flush=True)
        speed_rows.append(measure_speed(
            ROWS[name], small=args.small, iters=args.iters, warmup=args.warmup,
            with_torch_compile=args.torch_compile,
            torch_compile_budget_s=args.torch_compile_budget))
    print(render_table(SPEED_COLUMNS, [speed_cells(r) for r in speed_rows]))
    for row in speed_rows:
        print(f"  {row.row}: {ROWS[row.row].description}")
    for row in speed_rows:
        for note in row.notes:
            print(f"note: {row.row}: {note}")

    compile_rows = []
    if args.compile_times:
        print(f"\n# first call (capture + compile + run) in a fresh process; cold: empty "
              f"EMBER_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR, warm: a second process reusing "
              f"them", flush=True)
        for name in compile_names:
            print(f"# compile times: {name} ...", file=sys.stderr, flush=True)
            compile_rows.append(measure_compile_times(
                ROWS[name], compilers, small=args.small, threads=args.threads,
                timeout_s=args.compile_timeout))
        print(render_table(compile_columns(compilers),
                           [compile_cells(r, compilers) for r in compile_rows]))
        for row in compile_rows:
            for note in row.notes:
                print(f"note: {row.row}: {note}")

    if args.json:
        report = {
            "torch": torch.__version__, "python": platform.python_version(),
            "device": "cpu", "threads": torch.get_num_threads(), "iters": args.iters,
            "warmup": args.warmup, "small": args.small, "torch_compile": args.torch_compile,
            "rows": [r.as_dict() for r in speed_rows],
            "compile_times": [r.as_dict() for r in compile_rows],
        }
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
