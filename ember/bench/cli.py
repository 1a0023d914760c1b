"""``ember bench``: benchmark kernels and the model zoo, one table row per kernel or model.

    ember bench [--suite builtin,kernels,gpu] [--models NAMES] [--device cpu|cuda]
                [--compilers eager,ember,ember-reduce-overhead,torch-inductor,
                             torch-inductor-reduce-overhead | all]
                [--dtype float32|float16|bfloat16] [--batch-size N] [--kernel-bytes B]
                [--iters N] [--warmup N] [--backend NAME] [--no-torch-compile]
                [--torch-compile-budget S] [--threads N] [--json PATH]

``python -m ember.bench`` takes the same options (without the word ``bench``). Rows come from
``--suite`` (a comma list: ``builtin``, the small zoo models whose package is installed, the
default; ``kernels``, the three rows of ``ember.bench.kernels``; ``gpu``, the five large
bfloat16 models) followed by ``--models`` (model or kernel names); without ``--models`` the
suite defaults to ``builtin``, with it to none. Kernel rows print in their own table (GB/s
against a ``copy_`` of the same bytes), model rows in the model table.

Bad input (unknown model, kernel, suite or compiler, unknown backend, no CUDA) exits with
status 2 and a message, like any argparse error; a variant that fails becomes "n/a" with a
note instead of stopping the run, and so does a row that cannot even be built (a missing
timm model, out of memory), so one long GPU run reports every row it can.

``--threads``: on a 2-vCPU virtual machine, two intra-op threads made eager times swing 10x
between runs (a stolen vCPU stalls the other at OpenMP barriers) while one thread stayed within
~20%; the default is still torch's own choice, so the numbers describe a normal set-up.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import platform
import re
import sys
from typing import Callable

import torch

from ember.backends import list_backends
from ember.bench import kernels, models
from ember.bench.harness import (DEFAULT_COMPILERS, LABELS, VARIANTS, Row,
                                 _one_line, benchmark_kernel, benchmark_model,
                                 resolve_compilers)

SUITES = ("builtin", "kernels", "gpu")
Column = tuple[str, Callable[[Row], str]]


def build_parser(prog: str = "ember bench") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Time kernels and models eagerly, under ember.compile and "
                               "under torch.compile, side by side in one process.")
    parser.add_argument("--suite", default=None,
                        help=f"comma-separated suites: {', '.join(SUITES)} (default: builtin, "
                             f"or none when --models is given)")
    parser.add_argument("--models", default=None,
                        help=f"comma-separated model or kernel names, measured after the "
                             f"suites' (models: {', '.join(models.known())}; kernels: "
                             f"{', '.join(kernels.known())})")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        choices=("cpu", "cuda"), help="default: cuda when available")
    parser.add_argument("--compilers", default=None,
                        help=f"comma-separated variants to measure, or all (known: "
                             f"{', '.join(VARIANTS)}; default: "
                             f"{','.join(DEFAULT_COMPILERS)}); eager is always measured")
    parser.add_argument("--dtype", default=None, choices=tuple(models.DTYPES),
                        help="cast models' floating-point weights and inputs, and kernels' "
                             "tensors (default: each row's own: bfloat16 for the gpu suite, "
                             "float32 otherwise)")
    parser.add_argument("--batch-size", type=int, default=None, metavar="N",
                        help="batch size of every model (default: each model's own for the "
                             "device)")
    parser.add_argument("--kernel-bytes", type=_byte_count, default=None, metavar="B",
                        help=f"bytes of each kernel input tensor, an integer or 2^N (default: "
                             f"2^{kernels.CUDA_TENSOR_BYTES.bit_length() - 1} on cuda, "
                             f"2^{kernels.CPU_TENSOR_BYTES.bit_length() - 1} on cpu)")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per variant")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per variant")
    parser.add_argument("--backend", default="ember",
                        help=f"ember.compile backend ({', '.join(list_backends())})")
    parser.add_argument("--no-torch-compile", dest="torch_compile", action="store_false",
                        help="do not measure torch.compile (drops the torch-inductor variants "
                             "from --compilers)")
    parser.add_argument("--torch-compile-budget", type=float, default=90.0, metavar="S",
                        help="skip torch.compile for a model whose compile takes over S "
                             "seconds (default 90)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch.set_num_threads(N) for every variant (default: torch's "
                             "choice); 1 gives steadier times on small, shared machines")
    parser.add_argument("--json", metavar="PATH",
                        help="also write the rows as JSON (rewritten after every row)")
    return parser


# The ``ember`` command's subcommands: name -> (one-line help, "module:function"). The function
# takes ``(argv, prog)`` and returns an exit status; its module is imported only when the
# subcommand runs, so ``ember --help`` stays fast. A new subcommand (``explain``) adds one line.
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("time models eagerly and under Ember and torch.compile, check their results",
              "ember.bench.cli:bench_main"),
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
    """--suite's names; without it, builtin, or none when --models is given."""
    if args.suite is not None:
        return _split(args.suite)
    return [] if args.models else ["builtin"]


def select_rows(parser: argparse.ArgumentParser, args) -> list[tuple[str, str]]:
    """(kind, name) of each row to measure, in order, without repeats; usage errors exit."""
    suites = selected_suites(args)
    unknown = [s for s in suites if s not in SUITES]
    if unknown or (args.suite is not None and not suites):
        parser.error(f"--suite: unknown suite(s) {', '.join(unknown) or '(none given)'}; "
                     f"known: {', '.join(SUITES)}")
    rows: list[tuple[str, str]] = []
    for suite in suites:
        if suite == "kernels":
            rows += [("kernel", name) for name in kernels.known()]
        elif suite == "builtin":
            rows += [("model", name) for name in models.available("builtin")]
        else:
            rows += [("model", name) for name in models.in_suite(suite)]
    rows += [("kernel" if name in kernels.KERNELS else "model", name)
             for name in _split(args.models)]
    try:
        models.check_names([name for kind, name in rows if kind == "model"])
    except models.UnknownModelError as e:
        parser.error(f"{e}; known kernels: {', '.join(kernels.known())}")
    except models.ModelUnavailableError as e:
        parser.error(str(e))
    if not rows:
        parser.error("nothing to measure: no suite or model selected")
    return list(dict.fromkeys(rows))


def bench_main(argv: list[str], prog: str = "ember bench") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    rows_to_run = select_rows(parser, args)
    try:
        compilers = resolve_compilers(args.compilers, args.torch_compile)
    except ValueError as e:
        parser.error(f"--compilers: {e}")
    if args.backend not in list_backends():
        parser.error(f"unknown backend {args.backend!r}; known backends: "
                     f"{', '.join(list_backends())}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if args.iters < 1 or args.warmup < 0:
        parser.error("--iters must be >= 1 and --warmup >= 0")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error("--batch-size must be >= 1")
    if args.kernel_bytes is not None and args.kernel_bytes < 4:
        parser.error("--kernel-bytes must be >= 4 (one float32 element)")
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    dtype = models.DTYPES[args.dtype] if args.dtype else None

    print(f"# torch {torch.__version__}, device {device_name(args.device)}, "
          f"{torch.get_num_threads()} threads, backend {args.backend!r}, dtype "
          f"{args.dtype or 'per row'}, compilers {','.join(compilers)}; "
          f"median of {args.iters} calls after {args.warmup} warm-up, alternating, timed "
          f"with {timer_name(args.device)}", flush=True)
    rows = []
    for kind, name in rows_to_run:
        print(f"# {name} ...", file=sys.stderr, flush=True)
        common = dict(iters=args.iters, warmup=args.warmup, compilers=compilers,
                      torch_compile_budget_s=args.torch_compile_budget, dtype=dtype)
        try:
            if kind == "kernel":
                row = benchmark_kernel(name, args.device, args.backend,
                                       tensor_bytes=args.kernel_bytes, **common)
            else:
                row = benchmark_model(name, args.device, args.backend,
                                      batch_size=args.batch_size, **common)
        except Exception as e:   # the row could not be built: report it, measure the rest
            row = Row(name, args.device, args.backend, eager_ms=None, kind=kind,
                      dtype=args.dtype, notes=[f"not measured: {_one_line(e)}"])
        rows.append(row)
        print(f"#   {progress_line(row)}", file=sys.stderr, flush=True)
        if args.json:   # after every row: a run cut short keeps the rows it finished
            write_json(args.json, rows, args, compilers)
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    print(format_report(rows, compilers))
    return 0


def progress_line(row: Row) -> str:
    """One line of a finished row's times, for the log while the run goes on."""
    parts = [f"{name} {fmt_ms(variant.ms)} ms" for name, variant in row.variants.items()]
    if row.copy_ms is not None:
        parts.append(f"copy {fmt_ms(row.copy_ms)} ms")
    return f"{row.model}: {', '.join(parts) or 'not measured'}"


def device_name(device: str) -> str:
    if device == "cuda" and torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name()})"
    return device


def timer_name(device: str) -> str:
    return "CUDA events" if device == "cuda" else "time.perf_counter"


def format_report(rows: list[Row], compilers=DEFAULT_COMPILERS) -> str:
    """The kernel table, the model table, one line per row saying what it ran, the notes."""
    parts = []
    kernel_rows = [row for row in rows if row.kind == "kernel"]
    model_rows = [row for row in rows if row.kind != "kernel"]
    if kernel_rows:
        parts.append(format_kernel_table(kernel_rows, compilers))
    if model_rows:
        parts.append(format_table(model_rows, compilers))
    lines = ["\n\n".join(parts)]
    for row in rows:
        if row.inputs:
            what = [row.dtype or "?"]
            if row.bytes_moved:
                what.append(f"{row.bytes_moved / 1e6:.1f} MB moved per call")
            if row.batch_size:
                what.append(f"batch {row.batch_size}")
            lines.append(f"  {row.model}: {', '.join(what)}; inputs {', '.join(row.inputs)}")
    for row in rows:
        for note in row.notes:
            lines.append(f"note: {row.model}: {note}")
    return "\n".join(lines)


def _shown(compilers) -> list[str]:
    """Variants with a column: eager, ember and torch.compile always (n/a when not measured,
    as before), the reduce-overhead ones when measured."""
    return [v for v in VARIANTS if v in DEFAULT_COMPILERS or v in compilers]


def model_columns(compilers=DEFAULT_COMPILERS) -> list[Column]:
    shown = _shown(compilers)
    ro, tc_ro = "ember-reduce-overhead", "torch-inductor-reduce-overhead"
    columns: list[Column] = [
        ("model", lambda r: r.model),
        ("eager ms", lambda r: fmt_ms(r.eager_ms)),
        ("ember ms", lambda r: fmt_ms(r.ember_ms)),
        ("speedup", lambda r: fmt_ratio(r.speedup)),
        ("torch.compile ms", lambda r: fmt_ms(r.torch_compile_ms)),
        ("ember vs torch.compile", lambda r: fmt_ratio(r.vs_torch_compile)),
    ]
    if ro in shown:
        columns += [("ember-ro ms", lambda r: fmt_ms(r.ms(ro))),
                    ("ember-ro speedup", lambda r: fmt_ratio(_div(r.eager_ms, r.ms(ro))))]
    if tc_ro in shown:
        columns += [("torch.compile-ro ms", lambda r: fmt_ms(r.ms(tc_ro)))]
    if ro in shown and tc_ro in shown:
        columns += [("ember-ro vs torch.compile-ro",
                     lambda r: fmt_ratio(_div(r.ms(tc_ro), r.ms(ro))))]
    columns += [
        ("max abs err", lambda r: fmt_err(r.max_abs_err)),
        ("graphs", lambda r: _int(r.graphs)),
        ("graph breaks", lambda r: _int(r.graph_breaks)),
        ("compile s", lambda r: "n/a" if r.compile_s is None else f"{r.compile_s:.2f}"),
    ]
    return columns


def kernel_columns(compilers=DEFAULT_COMPILERS) -> list[Column]:
    columns: list[Column] = [
        ("kernel", lambda r: r.model),
        ("MB moved", lambda r: "n/a" if r.bytes_moved is None else f"{r.bytes_moved / 1e6:.1f}"),
        ("copy GB/s", lambda r: fmt_gbps(r.copy_gbps)),
    ]
    for variant in _shown(compilers):
        columns.append((f"{LABELS[variant]} GB/s",
                        lambda r, v=variant: fmt_gbps(r.gbps(v), r.fraction_of_copy(v))))
    columns.append(("ember err", lambda r: fmt_err(r.max_abs_err)))
    return columns


def format_table(rows: list[Row], compilers=DEFAULT_COMPILERS) -> str:
    """The model table: times in ms, ratios, Ember's error, graphs and compile time."""
    columns = model_columns(compilers)
    return render_table([c for c, _ in columns], [[cell(row) for _, cell in columns]
                                                  for row in rows])


def format_kernel_table(rows: list[Row], compilers=DEFAULT_COMPILERS) -> str:
    """The kernel table: GB/s of copy_ and of each variant, with its fraction of copy's."""
    columns = kernel_columns(compilers)
    return render_table([c for c, _ in columns], [[cell(row) for _, cell in columns]
                                                  for row in rows])


COLUMNS = tuple(name for name, _ in model_columns())
KERNEL_COLUMNS = tuple(name for name, _ in kernel_columns())


def render_table(columns, lines) -> str:
    """A plain-text table: the first column left-aligned, the others right-aligned."""
    cells = [tuple(columns)] + [tuple(line) for line in lines]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]

    def render(line):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(line, widths)))

    return "\n".join([render(cells[0]), render(["-" * w for w in widths])]
                     + [render(line) for line in cells[1:]])


def _div(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def fmt_gbps(value: float | None, fraction: float | None = None) -> str:
    """``812`` GB/s, with the fraction of copy's as ``812 (73%)`` when given."""
    if value is None:
        return "n/a"
    text = f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return text if fraction is None else f"{text} ({fraction:.0%})"


def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}" if value < 1 else f"{value:.2f}"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def fmt_err(value: float | None) -> str:
    return "n/a" if value is None else "inf" if math.isinf(value) else f"{value:.1e}"


def _int(value: int | None) -> str:
    return "n/a" if value is None else str(value)


def write_json(path: str, rows: list[Row], args: argparse.Namespace,
               compilers=DEFAULT_COMPILERS) -> None:
    report = {
        "torch": torch.__version__, "python": platform.python_version(),
        "device": args.device, "device_name": device_name(args.device),
        "threads": torch.get_num_threads(), "backend": args.backend,
        "iters": args.iters, "warmup": args.warmup, "timer": timer_name(args.device),
        "compilers": list(compilers), "dtype": args.dtype,
        "suites": selected_suites(args),
        "batch_size": args.batch_size, "kernel_bytes": args.kernel_bytes,
        "rows": [row.as_dict() for row in rows],
    }
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
