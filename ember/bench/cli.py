"""The ``ember`` command, and ``ember bench``: measure models eagerly and under each compiler,
check their results, and report speedups, compile times, graphs and memory.

    ember bench [--suite builtin|timm|hf|torchvision|all|kernels|gpu] [--models a,b]
                [--device cpu|cuda] [--dtype float32|float16|bfloat16] [--amp]
                [--mode infer|train] [--batch-size N]
                [--compilers eager,ember,ember-reduce-overhead,ember-max-autotune,
                             torch-inductor,... | all]
                [--repeat N] [--warmup N] [--out DIR [--resume [--retry-failed]]]
                [--compare A.json B.json] [--show RESULTS.json] [--timeout S] [--budget S]
                [--no-isolate] [--no-warm-compile] [--backend NAME]
                [--no-torch-compile] [--torch-compile-budget S] [--threads N]
                [--json PATH] [--kernel-bytes B]

``python -m ember.bench`` takes the same options (without the word ``bench``). Rows come from
``--suite`` (a comma list; ``all`` is builtin, timm, hf and torchvision) followed by
``--models`` (zoo model names, kernel names, or ``module:callable``); without ``--models`` the
suite defaults to ``builtin``, with it to none. A suite whose package is not installed is
skipped with a message. Each row runs in its own process under ``--timeout`` (``runner``),
and the results are shown as tables (``report``), saved under ``--out``.

Usage errors (unknown model, kernel, suite or compiler, a bad number, no CUDA, ``--compare``
mixed with run options) exit with status 2 and a message naming the option; a model or
compiler that fails becomes a row or a cell with its error instead of stopping the run. The
run then exits with status 1, after one line on stderr naming each selected row that failed
(error, crash, timeout, a variant that failed to compile or run) or computed a wrong result,
so scripts and CI can rely on the status; rows skipped on purpose (``--budget``,
``--torch-compile-budget``) are not failures. A run that measured everything right exits 0.

Long runs (``--suite all`` takes hours on a small CPU) must survive being stopped. With
``--out DIR`` every selected row is written to ``DIR/results.json`` as ``not run`` before the
first one starts, and each row replaces its line as soon as it is measured; ``DIR/run.log``
gets one line per finished row. SIGTERM, SIGHUP or SIGINT stop the run cleanly
(``runner.stop_on_signals``): the current row becomes ``interrupted``, the rest stay ``not
run`` with the reason, the outputs and the table are written, and the exit status is 128 +
the signal's number. ``--resume`` continues from ``DIR``: rows that finished (``ok``,
``error``, ``crashed``, ``timeout``; with ``--retry-failed`` only ``ok``) are kept, the
others run again, and rows of ``DIR`` that this command does not select stay (so suites can
be run one by one into one folder). The
settings that change the numbers (device, mode, dtype, compilers, repeat, warmup, threads,
backend, batch size, torch version) must match the saved run's, or it is a usage error.

``--threads``: on a 2-vCPU virtual machine, two intra-op threads made eager times swing 10x
between runs (a stolen vCPU stalls the other at OpenMP barriers) while one thread stayed within
~20%; the default is still torch's own choice, so the numbers describe a normal set-up.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import platform
import re
import sys
import tempfile
import time
import traceback

import torch

from ember.backend_registry import list_backends
from ember.bench import compat, harness, kernels, report, runner, zoo
from ember.bench.harness import (DEFAULT_COMPILERS, MODES, VARIANTS, Row, is_user_compiler,
                                 resolve_compilers)

SUITES = ("builtin", "timm", "hf", "torchvision", "kernels", "gpu")
ALL_SUITES = ("builtin", "timm", "hf", "torchvision")   # what --suite all means
# The packages a suite needs, checked without importing them.
SUITE_PACKAGES = {"timm": "timm", "hf": "transformers", "torchvision": "torchvision",
                  "gpu": "timm,transformers"}
DEFAULT_TIMEOUT_S = 900.0


# The ``ember`` command's subcommands: name -> (one-line help, "module:function"). The function
# takes ``(argv, prog)`` and returns an exit status; its module is imported only when the
# subcommand runs, so ``ember --help`` stays fast. A new subcommand (``explain``) adds one line.
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("time models eagerly and under Ember and torch.compile, check their results",
              "ember.bench.cli:bench_main"),
    "explain": ("show where a model's graphs break, and why (ember.explain's report)",
                "ember.bench.explain_cmd:explain_main"),
}


def build_main_parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<10} {text}" for name, (text, _) in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="ember", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Ember, a just-in-time compiler for PyTorch.",
        epilog=f"commands:\n{listing}\n\n'ember COMMAND --help' describes a command's options.")
    parser.add_argument("command", choices=tuple(COMMANDS), metavar="COMMAND",
                        help=f"one of: {', '.join(COMMANDS)}")
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ember`` command: ``ember COMMAND [options]``. Usage errors exit 2
    (argparse's SystemExit), ``--help`` exits 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_main_parser()
    if not argv:
        parser.error(f"a COMMAND is required: {', '.join(COMMANDS)}")
    args = parser.parse_args(argv)
    module_name, function_name = COMMANDS[args.command][1].split(":")
    command = getattr(importlib.import_module(module_name), function_name)
    return command(args.args, prog=f"ember {args.command}")


def build_parser(prog: str = "ember bench") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Time models eagerly and under each compiler, side by side, "
                               "each model in its own process; check every result against a "
                               "float64 eager reference; report speedups, compile times, "
                               "graphs, kernels and memory.")
    parser.add_argument("--suite", default=None,
                        help=f"comma-separated suites: {', '.join(SUITES)}, or all "
                             f"(= {','.join(ALL_SUITES)}); default: builtin, or none when "
                             f"--models is given")
    parser.add_argument("--models", default=None,
                        help="comma-separated models, measured after the suites': zoo names "
                             "(see --list), kernel names "
                             f"({', '.join(kernels.known())}), or module:callable / "
                             "file.py:callable returning (model, example_inputs)")
    parser.add_argument("--list", action="store_true",
                        help="list the suites' models and exit")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        choices=("cpu", "cuda"), help="default: cuda when available")
    parser.add_argument("--dtype", default=None, choices=tuple(zoo.DTYPES),
                        help="cast models' floating-point weights and inputs, and kernels' "
                             "tensors (default: each row's own: bfloat16 for the gpu suite, "
                             "float32 otherwise)")
    parser.add_argument("--amp", action="store_true",
                        help="automatic mixed precision: float32 weights and inputs, the "
                             "model run under torch.autocast to --dtype (float16 or "
                             "bfloat16, default bfloat16) inside the compiled frame; results "
                             "are checked with that dtype's tolerance")
    parser.add_argument("--mode", default="infer", choices=MODES,
                        help="infer: eval() under no_grad (default); train: one training step "
                             "(forward, sum of outputs as loss, backward), gradients checked")
    parser.add_argument("--batch-size", type=int, default=None, metavar="N",
                        help="batch size of every model (default: each model's own for the "
                             "device)")
    parser.add_argument("--compilers", default=None,
                        help=f"comma-separated variants, or all (known: {', '.join(VARIANTS)}; "
                             f"or module:callable, a function compiling a model; default: "
                             f"{','.join(DEFAULT_COMPILERS)}); eager is always measured")
    parser.add_argument("--repeat", "--iters", dest="repeat", type=int, default=20,
                        metavar="N", help="timed calls per variant; the time is their median "
                                          "(default 20)")
    parser.add_argument("--warmup", type=int, default=3, metavar="N",
                        help="untimed calls per variant before timing (default 3)")
    parser.add_argument("--out", metavar="DIR",
                        help="write results.json, results.csv, speedups.png, run.log and the "
                             "rows' logs (logs/) to DIR; JSON and CSV are rewritten after "
                             "every model, the models not yet run listed as 'not run'")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run saved in --out DIR: its finished rows are kept "
                             "and not run again, the others run; rows of DIR that this "
                             "command does not select are kept too (run suite by suite into "
                             "one folder). The settings that change the numbers must match")
    parser.add_argument("--retry-failed", action="store_true",
                        help="with --resume: run again the rows that ended in error, crashed "
                             "or timeout too (by default they are kept as finished)")
    parser.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                        help="print per-model ratios between two saved runs and exit")
    parser.add_argument("--show", metavar="RESULTS.json",
                        help="print the tables of a saved run (a run going on, or stopped: "
                             "its rows not yet run say so) and exit")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"seconds each model's process may run before it is killed and "
                             f"reported as a timeout (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--budget", type=float, default=None, metavar="S",
                        help="start no model after S seconds of the run; the models left "
                             "become rows with status 'skipped' (default: no limit)")
    parser.add_argument("--no-isolate", dest="isolate", action="store_false",
                        help="run every row in this process (debugging; no timeout, no "
                             "crash isolation, no warm compile time)")
    parser.add_argument("--no-warm-compile", dest="warm_compile", action="store_false",
                        help="skip the second process per model that measures warm compile "
                             "times")
    parser.add_argument("--backend", default="ember",
                        help=f"ember.compile backend of the ember variants "
                             f"({', '.join(list_backends())})")
    parser.add_argument("--no-torch-compile", dest="torch_compile", action="store_false",
                        help="do not measure torch.compile (drops the torch-inductor variants "
                             "from --compilers)")
    parser.add_argument("--torch-compile-budget", type=float, default=90.0, metavar="S",
                        help="skip torch.compile for a model whose first call takes over S "
                             "seconds (default 90)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch.set_num_threads(N) for every variant (default: torch's "
                             "choice); 1 gives steadier times on small, shared machines")
    parser.add_argument("--json", metavar="PATH",
                        help="also write the results as JSON to PATH (rewritten after every "
                             "row)")
    parser.add_argument("--kernel-bytes", type=_byte_count, default=None, metavar="B",
                        help=f"bytes of each kernel row's input tensor, an integer or 2^N "
                             f"(default: 2^{kernels.CUDA_TENSOR_BYTES.bit_length() - 1} on "
                             f"cuda, 2^{kernels.CPU_TENSOR_BYTES.bit_length() - 1} on cpu)")
    return parser


def _byte_count(text: str) -> int:
    """An integer, or 2^N / 2**N."""
    match = re.fullmatch(r"\s*2\s*(?:\^|\*\*)\s*(\d+)\s*", text)
    try:
        return 2 ** int(match.group(1)) if match else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a byte count (an integer or 2^N), got "
                                         f"{text!r}") from None


def _split(text: str | None) -> list[str]:
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def selected_suites(args) -> list[str]:
    """--suite's names (``all`` expanded); without it, builtin, or none with --models."""
    if args.suite is None:
        return [] if args.models else ["builtin"]
    names = []
    for name in _split(args.suite):
        names += list(ALL_SUITES) if name == "all" else [name]
    return list(dict.fromkeys(names))


def missing_suite_package(suite: str) -> str | None:
    """The first package ``suite`` needs that is not installed (checked without importing)."""
    for package in _split(SUITE_PACKAGES.get(suite)):
        if importlib.util.find_spec(package) is None:
            return package
    return None


def select_rows(parser: argparse.ArgumentParser, args) -> list[tuple[str, str, str | None]]:
    """(kind, name, suite) of each row to measure, in order, without repeats; usage errors
    exit; a suite whose package is missing is skipped with a message."""
    suites = selected_suites(args)
    unknown = [s for s in suites if s not in SUITES]
    if unknown or (args.suite is not None and not suites):
        parser.error(f"--suite: unknown suite(s) {', '.join(unknown) or '(none given)'}; "
                     f"known: {', '.join(SUITES)}, all")
    rows: list[tuple[str, str, str | None]] = []
    for suite in suites:
        missing = missing_suite_package(suite)
        if missing:
            print(f"ember bench: skipping suite {suite!r}: the {missing!r} package is not "
                  f"installed (pip install torch=={torch.__version__.split('+')[0]} "
                  f"'ember[bench]' installs it)", file=sys.stderr)
        elif suite == "kernels":
            rows += [("kernel", name, suite) for name in kernels.known()]
        else:
            rows += [("model", name, suite) for name in zoo.in_suite(suite, args.mode)
                     if zoo.missing_package(name) is None]
    for name in _split(args.models):
        if name in kernels.KERNELS:
            rows.append(("kernel", name, None))
        elif zoo.is_user_model(name):
            check_callable_spec(parser, "--models", name)
            rows.append(("model", name, None))
        else:
            rows.append(("model", name, None))
    try:
        zoo.check_names([name for kind, name, _ in rows if kind == "model"])
    except zoo.UnknownModelError as e:
        parser.error(f"--models: {e}; known kernels: {', '.join(kernels.known())}")
    except zoo.ModelUnavailableError as e:
        parser.error(f"--models: {e}")
    if not rows:
        parser.error("nothing to measure: no suite or model selected (or every selected "
                     "suite was skipped)")
    seen, unique = set(), []
    for kind, name, suite in rows:
        if (kind, name) not in seen:
            seen.add((kind, name))
            unique.append((kind, name, suite))
    return unique


def check_callable_spec(parser: argparse.ArgumentParser, option: str, name: str) -> None:
    """A module:callable's module (or file) must exist; the callable is checked in the row's
    process, where it is imported."""
    target, _, attr = name.rpartition(":")
    if not target or not attr:
        parser.error(f"{option}: {name!r}: expected module:callable or file.py:callable")
    if target.endswith(".py") or os.sep in target:
        if not os.path.isfile(target):
            parser.error(f"{option}: {name!r}: no file {target!r}")
        return
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = importlib.util.find_spec(target)
    except ImportError:
        found = None
    if found is None:
        parser.error(f"{option}: {name!r}: no module named {target!r}")


def _explicit(parser: argparse.ArgumentParser, args) -> list[str]:
    """Options given on the command line (their value differs from the default)."""
    return [action.option_strings[0] for action in parser._actions
            if action.option_strings and action.dest != "help"
            and getattr(args, action.dest) != action.default]


def _alone(parser, args, flag: str, what: str) -> None:
    """``flag`` takes no other option: an error names the ones given."""
    others = [o for o in _explicit(parser, args) if o != flag]
    if others:
        parser.error(f"{flag} {what} and takes no other option (got {', '.join(others)})")


def bench_main(argv: list[str], prog: str = "ember bench") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.compare:
        _alone(parser, args, "--compare", "prints a comparison of two saved runs")
        try:
            print(report.format_compare(*args.compare))
        except (OSError, ValueError) as e:
            parser.error(f"--compare: {e}")
        return 0
    if args.show:
        _alone(parser, args, "--show", "prints the tables of a saved run")
        try:
            data, rows = report.load_rows(args.show)
        except (OSError, ValueError) as e:
            parser.error(f"--show: {e}")
        print(report.format_report(rows, data.get("compilers") or ["eager"],
                                   data.get("device") or "cpu"))
        return 0
    if args.list:
        return _list_models()
    rows_to_run = select_rows(parser, args)
    try:
        compilers = resolve_compilers(args.compilers, args.torch_compile)
    except ValueError as e:
        parser.error(f"--compilers: {e}")
    for name in compilers:
        if is_user_compiler(name):
            check_callable_spec(parser, "--compilers", name)
    _validate(parser, args, rows_to_run)

    settings = run_settings(args, compilers)
    saved: list[Row] = []
    if args.resume:
        try:
            settings, saved = load_saved_run(args.out, settings, compilers)
        except ValueError as e:
            parser.error(f"--resume: {e}")
    _say(f"# torch {torch.__version__}, device {settings['device_name']}, "
         f"{settings['threads']} threads, mode {args.mode}, "
         f"{describe_dtype(args)}, "
         f"compilers {','.join(compilers)}; median of {args.repeat} calls after "
         f"{args.warmup} warm-up, alternating, timed with {settings['timer']}")
    rows, stopped = run_rows(args, compilers, rows_to_run, settings, saved)
    if args.out:
        _write_outputs(args, rows, settings, compilers, final=True)
    _say(report.format_report(rows, compilers, args.device))
    if args.out:
        written = [f for f in OUT_FILES + ("run.log", "logs/")
                   if os.path.exists(os.path.join(args.out, f))]
        _say(f"# wrote {', '.join(written)} to {args.out}")
    selected = {(kind, name) for kind, name, _ in rows_to_run}
    problems = [f"{row.model} ({', '.join(row_problems(row))})" for row in rows
                if (row.kind, row.model) in selected and row_problems(row)]
    if problems:
        _say(f"ember bench: {len(problems)} of {len(selected)} rows failed or were wrong: "
             f"{'; '.join(problems)}", file=sys.stderr)
    if stopped is not None:
        return 128 + stopped.signum
    return EXIT_FAILED if problems else 0


EXIT_FAILED = 1   # some selected row failed or was wrong (usage errors exit 2)


def row_problems(row: Row) -> list[str]:
    """Why ``row`` counts as failed: its status (``error``, ``crashed``, ``timeout``,
    ``interrupted``), or each variant that failed (``ember failed``) or computed a wrong
    result (``ember wrong``). Empty for a right row, and for rows not measured on purpose
    (``skipped`` by --budget, ``not run``) and variants skipped by --torch-compile-budget."""
    if row.status in ("skipped", "not run"):
        return []
    if row.status != "ok":
        return [row.status]
    problems = []
    for name, variant in row.variants.items():
        if variant.error is not None and not variant.error.startswith("skipped"):
            problems.append(f"{name} failed")
        elif variant.correct is False:
            problems.append(f"{name} wrong")
    return problems


def _say(text: str, file=None) -> None:
    """print, flushed. A closed pipe (``| head``, a reader that died) must not end the run:
    Python ignores SIGPIPE, so the write raises BrokenPipeError, which used to stop a long
    run in silence (its traceback went to the same closed pipe). The stream is replaced by
    os.devnull instead; results still go to ``--out``."""
    stream = file or sys.stdout
    try:
        print(text, file=stream, flush=True)
    except OSError:
        for name in ("stdout", "stderr"):
            if getattr(sys, name) is stream:
                setattr(sys, name, open(os.devnull, "w"))


# Settings a resumed run must share with the saved one: they change the numbers.
RESUME_SETTINGS = ("torch", "device", "mode", "dtype", "amp", "backend", "compilers",
                   "repeat", "warmup", "threads", "batch_size", "kernel_bytes")


def load_saved_run(out: str, settings: dict, compilers) -> tuple[dict, list[Row]]:
    """The settings to write (the saved run's suites and models joined with this run's) and
    the rows saved in ``out``/results.json; none when there is no such file. ValueError when
    the file is not a run, or when a setting of ``RESUME_SETTINGS`` differs."""
    path = os.path.join(out, "results.json")
    if not os.path.exists(path):
        _say(f"# --resume: no {path} yet: starting a new run", file=sys.stderr)
        return settings, []
    data, saved = report.load_rows(path)
    now = {**settings, "compilers": list(compilers)}
    different = [f"{key} {data.get(key)!r} (saved) vs {now.get(key)!r}"
                 for key in RESUME_SETTINGS if data.get(key) != now.get(key)]
    if different:
        raise ValueError(f"{path} was measured with other settings: {'; '.join(different)}; "
                         f"use another --out folder, or the saved run's options")
    merged = dict(settings)
    merged["started"] = data.get("started", settings["started"])
    for key in ("suites", "models"):
        merged[key] = list(dict.fromkeys(list(data.get(key) or []) + settings[key]))
    merged["resumed"] = list(data.get("resumed") or []) + [settings["started"]]
    return merged, saved


def _validate(parser: argparse.ArgumentParser, args, rows_to_run) -> None:
    if args.backend not in list_backends():
        parser.error(f"--backend: unknown backend {args.backend!r}; known backends: "
                     f"{', '.join(list_backends())}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error("--batch-size must be >= 1")
    if args.kernel_bytes is not None and args.kernel_bytes < 4:
        parser.error("--kernel-bytes must be >= 4 (one float32 element)")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.timeout <= 0:
        parser.error("--timeout must be > 0 seconds")
    if not args.isolate and args.timeout != DEFAULT_TIMEOUT_S:
        parser.error("--timeout: --no-isolate runs every row in this process, without a "
                     "timeout")
    if args.budget is not None and args.budget <= 0:
        parser.error("--budget must be > 0 seconds")
    if args.mode == "train" and any(kind == "kernel" for kind, _, _ in rows_to_run):
        parser.error("--mode train: kernel rows are inference only; leave out --suite "
                     "kernels and kernel names")
    if not args.isolate and not args.warm_compile:
        parser.error("--no-warm-compile: --no-isolate already measures no warm compile")
    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out: {args.out!r} exists and is not a folder")
    if args.amp and args.dtype == "float32":
        parser.error("--amp autocasts float32 weights to --dtype float16 or bfloat16 (default "
                     "bfloat16), not float32")
    if args.amp and any(kind == "kernel" for kind, _, _ in rows_to_run):
        parser.error("--amp: kernel rows take --dtype itself; leave out --suite kernels and "
                     "kernel names")
    if args.resume and not args.out:
        parser.error("--resume continues the run saved in --out DIR: give --out")
    if args.retry_failed and not args.resume:
        parser.error("--retry-failed re-runs failed rows of a resumed run: give --resume")


def amp_dtype(args) -> str | None:
    """--amp's autocast dtype (--dtype, default bfloat16), or None without --amp."""
    return (args.dtype or "bfloat16") if args.amp else None


def describe_dtype(args) -> str:
    if args.amp:
        return f"float32 weights, autocast {amp_dtype(args)}"
    return f"dtype {args.dtype or 'per row'}"


def run_settings(args, compilers) -> dict:
    """The run's settings, saved at the top of the JSON."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return {
        "torch": torch.__version__, "python": platform.python_version(),
        "platform": platform.platform(), "processor": platform.processor() or None,
        "device": args.device, "device_name": device_name(args.device),
        "threads": torch.get_num_threads(), "backend": args.backend, "mode": args.mode,
        "iters": args.repeat, "repeat": args.repeat, "warmup": args.warmup,
        "timer": timer_name(args.device), "dtype": None if args.amp else args.dtype,
        "amp": amp_dtype(args),
        "suites": selected_suites(args), "models": _split(args.models),
        "batch_size": args.batch_size, "kernel_bytes": args.kernel_bytes,
        "isolated": args.isolate, "timeout_s": args.timeout if args.isolate else None,
        "budget_s": args.budget,
        "warm_compile": args.isolate and args.warm_compile,
        "torch_compile_budget_s": args.torch_compile_budget,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def run_rows(args, compilers, rows_to_run, settings, saved: list[Row] = ()
             ) -> tuple[list[Row], "runner.RunStopped | None"]:
    """Measure every selected row that ``saved`` (a resumed run's rows) has not finished,
    isolated unless --no-isolate, with a progress display: (every row, in order, and the
    signal that stopped the run, or None). The rows left are written as ``not run`` first,
    and the outputs rewritten after every row."""
    tasks = [runner.Task(kind, name, suite, args.device, args.backend, compilers, args.mode,
                         args.dtype, args.batch_size, args.kernel_bytes, args.repeat,
                         args.warmup, args.torch_compile_budget, args.threads,
                         amp=amp_dtype(args))
             for kind, name, suite in rows_to_run]
    rows = list(saved)
    slot = {(row.kind, row.model): i for i, row in enumerate(rows)}
    todo: list[tuple[int, runner.Task]] = []
    for task in tasks:
        index = slot.get((task.kind, task.name))
        finished = ("ok",) if args.retry_failed else runner.FINISHED
        if index is not None and rows[index].status in finished:
            continue
        pending = runner.error_row(task, "not run", "not run: the run has not reached this "
                                                    "model (if it stopped, --resume continues "
                                                    "it)")
        if index is None:
            index = slot[(task.kind, task.name)] = len(rows)
            rows.append(pending)
        else:
            rows[index] = pending
        todo.append((index, task))
    log = RunLog(os.path.join(args.out, "run.log") if args.out else None)
    if saved:
        log.say(f"# resuming {args.out}: {len(tasks) - len(todo)} of the {len(tasks)} selected "
                f"rows are finished, {len(todo)} to run; {len(rows) - len(tasks)} other rows "
                f"kept")
    progress = Progress(len(todo), log)
    log_dir = None
    if args.isolate:
        log_dir = os.path.join(args.out, "logs") if args.out else tempfile.mkdtemp(
            prefix="ember-bench-logs-")
        run = runner.IsolatedRunner(args.timeout, log_dir, warm=args.warm_compile,
                                    preload=_preload(rows_to_run, compilers),
                                    on_stage=progress.stage)
    else:
        run = runner.InProcessRunner(on_stage=progress.stage)
    deadline = None if args.budget is None else time.monotonic() + args.budget
    stopped, position, started = None, 0, time.monotonic()
    try:
        with runner.stop_on_signals():
            try:
                _write_outputs(args, rows, settings, compilers)
                for position, (index, task) in enumerate(todo):
                    progress.start(task)
                    started = time.monotonic()
                    rows[index] = _run_one(run, task, args, deadline)
                    progress.done(task, rows[index])
                    _write_outputs(args, rows, settings, compilers)
                    if args.device == "cuda":
                        torch.cuda.empty_cache()
            except runner.RunStopped as e:
                stopped = e
                _mark_stopped(e, rows, todo, position, time.monotonic() - started, progress)
                log.say(f"# stopped by {e.signal_name}: "
                        f"{sum(rows[i].status == 'not run' for i, _ in todo)} model(s) not run"
                        + (f"; continue with --resume --out {args.out}" if args.out else ""))
                _write_outputs(args, rows, settings, compilers)
    finally:
        progress.close()
        run.close()
    if args.isolate and not args.out and any(row.status != "ok" for row in rows):
        _say(f"# logs of the rows' processes: {log_dir}", file=sys.stderr)
    return rows, stopped


def _mark_stopped(stop: "runner.RunStopped", rows: list[Row], todo, position: int,
                  seconds: float, progress: "Progress") -> None:
    """After a signal: the row being measured (``todo[position]``, unless it had just
    finished) is ``interrupted``, the rows after it are ``not run``, each saying why."""
    if not todo:
        return
    index, task = todo[position]
    if rows[index].status == "not run":
        stage = progress.stages.get(task)
        rows[index] = runner.error_row(
            task, "interrupted", f"interrupted by {stop.signal_name} after {seconds:.0f} s"
                                 + (f" ({stage})" if stage else ""))
        progress.done(task, rows[index])
    for later_index, later in todo[position + 1:]:
        rows[later_index] = runner.error_row(
            later, "not run", f"not run: the run was stopped by {stop.signal_name} before "
                              f"this model")


def _run_one(run, task: runner.Task, args, deadline: float | None) -> Row:
    """One row; a failure of the runner itself (not of the model) is that row's error, and
    the run goes on."""
    if deadline is not None and time.monotonic() > deadline:
        return runner.error_row(task, "skipped", f"not run: the run's --budget of "
                                                 f"{args.budget:g} s was spent")
    try:
        return run.run(task)
    except Exception as e:   # noqa: BLE001  the runner failed, not the row: say it, go on
        traceback.print_exc()
        return runner.error_row(task, "error", f"runner failed: {harness._one_line(e)}")


class RunLog:
    """``--out``'s run.log: a line per finished row and why the run stopped, appended and
    flushed as they happen, whatever becomes of stdout."""

    def __init__(self, path: str | None):
        self.path = path
        if path is not None:
            os.makedirs(os.path.dirname(path), exist_ok=True)

    def say(self, line: str, echo: bool = True) -> None:
        if echo:
            _say(line, file=sys.stderr)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(f"{time.strftime('%H:%M:%S')} {line}\n")


def _preload(rows_to_run, compilers) -> tuple[str, ...]:
    """What the rows' processes should find imported (see ``ember.bench._preload``)."""
    preload = []
    needs = {zoo.MODELS[name].requires for kind, name, _ in rows_to_run
             if kind == "model" and name in zoo.MODELS}
    preload += [p for p in ("timm", "transformers", "torchvision") if p in needs]
    if any(c.startswith("torch-inductor") for c in compilers):
        preload.append("inductor")
    return tuple(preload)


OUT_FILES = ("results.json", "results.csv", "speedups.png")


def _write_outputs(args, rows: list[Row], settings: dict, compilers, final: bool = False):
    """--json after every row; --out's JSON and CSV after every row, its chart at the end."""
    data = report.report_dict(rows, settings, compilers)
    if args.json:
        report.write_json(args.json, data)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        report.write_json(os.path.join(args.out, "results.json"), data)
        report.write_csv(os.path.join(args.out, "results.csv"), rows)
        if final:
            title = (f"ember bench: {settings['device_name']}, {args.mode}, "
                     f"{describe_dtype(args) if args.amp else args.dtype or 'float32'}; "
                     f"torch {settings['torch']}")
            try:
                report.write_chart(os.path.join(args.out, "speedups.png"), rows, compilers,
                                   title)
            except ImportError as e:   # matplotlib comes with the bench extra
                print(f"# speedups.png not drawn: {e} (pip install matplotlib)")


def _list_models() -> int:
    for suite in SUITES:
        if suite == "kernels":
            names = kernels.known()
        else:
            names = zoo.in_suite(suite)
        missing = missing_suite_package(suite)
        print(f"{suite}{f' (needs {missing}, not installed)' if missing else ''}:")
        for name in names:
            description = kernels.KERNELS[name].description if suite == "kernels" else \
                zoo.MODELS[name].description
            print(f"  {name:34} {description}")
    return 0


class Progress:
    """A rich progress bar on a terminal (stderr); elsewhere one line per finished row. Each
    finished row's line also goes to ``log`` (run.log)."""

    def __init__(self, total: int, log: RunLog | None = None):
        self.total, self.count = total, 0
        self.log = log or RunLog(None)
        self.stages: dict[runner.Task, str] = {}   # the last stage each row reported
        self.bar = None
        if sys.stderr.isatty():
            try:
                from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar,
                                           TextColumn, TimeElapsedColumn)
            except ImportError:
                return
            self.bar = Bar(TextColumn("{task.description}"), BarColumn(),
                           MofNCompleteColumn(), TimeElapsedColumn(), transient=False)
            self.bar.start()
            self.task_id = self.bar.add_task("ember bench", total=total)

    def start(self, task: runner.Task) -> None:
        self.stage(task, "starting")

    def stage(self, task: runner.Task, stage: str) -> None:
        self.stages[task] = stage
        if self.bar is not None:
            self.bar.update(self.task_id, description=f"{task.name}: {stage}")

    def done(self, task: runner.Task, row: Row) -> None:
        self.count += 1
        line = f"[{self.count}/{self.total}] {progress_line(row)}"
        self.log.say(f"# {line}", echo=False)
        if self.bar is not None:
            try:
                self.bar.console.print(line, highlight=False)
            except OSError:
                pass
            self.bar.advance(self.task_id)
        else:
            _say(f"# {line}", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def progress_line(row: Row) -> str:
    """One line of a finished row, for the log while the run goes on."""
    if row.status != "ok":
        return f"{row.model}: {row.error}"
    parts = [f"{name} {report.fmt_ms(row.ms(name))} ms" for name in row.variants]
    if row.copy_ms is not None:
        parts.append(f"copy {report.fmt_ms(row.copy_ms)} ms")
    return f"{row.model}: {', '.join(parts)}"


def device_name(device: str) -> str:
    if device == "cuda" and torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name()})"
    return device


def timer_name(device: str) -> str:
    return "CUDA events" if device == "cuda" else "time.perf_counter"


if __name__ == "__main__":
    sys.exit(main())
