"""``ember bench``: benchmark the model zoo and print one table row per model.

    ember bench [--models mlp,convnet,...] [--device cpu|cuda] [--iters N] [--warmup N]
                [--backend NAME] [--no-torch-compile] [--torch-compile-budget S]
                [--threads N] [--json PATH]

``python -m ember.bench`` takes the same options (without the word ``bench``). The default
model list is every model whose package is installed (``ember.bench.models.available()``).
Bad input (unknown model, unknown backend, no CUDA) exits with status 2 and a message, like
any argparse error; a model that fails under one compiler becomes "n/a" with a note instead of
stopping the run.

``--threads``: on a 2-vCPU virtual machine, two intra-op threads made eager times swing 10x
between runs (a stolen vCPU stalls the other at OpenMP barriers) while one thread stayed within
~20%; the default is still torch's own choice, so the numbers describe a normal set-up.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys

import torch

from ember.backends import list_backends
from ember.bench import models
from ember.bench.harness import Row, benchmark_model

COLUMNS = ("model", "eager ms", "ember ms", "speedup", "torch.compile ms",
           "ember vs torch.compile", "max abs err", "graphs", "graph breaks", "compile s")


def build_parser(prog: str = "ember bench") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Time the built-in models eagerly, under ember.compile and "
                               "under torch.compile, side by side in one process.")
    parser.add_argument("--models", default=None,
                        help=f"comma-separated model names (default: all installed; known: "
                             f"{', '.join(models.known())})")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        choices=("cpu", "cuda"), help="default: cuda when available")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per variant")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per variant")
    parser.add_argument("--backend", default="ember",
                        help=f"ember.compile backend ({', '.join(list_backends())})")
    parser.add_argument("--no-torch-compile", dest="torch_compile", action="store_false",
                        help="do not measure torch.compile")
    parser.add_argument("--torch-compile-budget", type=float, default=90.0, metavar="S",
                        help="skip torch.compile for a model whose compile takes over S "
                             "seconds (default 90)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch.set_num_threads(N) for every variant (default: torch's "
                             "choice); 1 gives steadier times on small, shared machines")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ember`` command; its one subcommand is ``bench``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "bench":
        print("usage: ember bench [options]   (ember bench --help lists them)",
              file=sys.stderr)
        return 2
    return bench_main(argv[1:])


def bench_main(argv: list[str], prog: str = "ember bench") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    names = ([n.strip() for n in args.models.split(",") if n.strip()]
             if args.models else models.available())
    try:
        models.check_names(names)
    except (models.UnknownModelError, models.ModelUnavailableError) as e:
        parser.error(str(e))
    if args.backend not in list_backends():
        parser.error(f"unknown backend {args.backend!r}; known backends: "
                     f"{', '.join(list_backends())}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if args.iters < 1 or args.warmup < 0:
        parser.error("--iters must be >= 1 and --warmup >= 0")
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)

    print(f"# torch {torch.__version__}, device {args.device}, "
          f"{torch.get_num_threads()} threads, backend {args.backend!r}, "
          f"median of {args.iters} calls after {args.warmup} warm-up", flush=True)
    rows = []
    for name in names:
        print(f"# {name} ...", file=sys.stderr, flush=True)
        rows.append(benchmark_model(name, args.device, args.backend, iters=args.iters,
                                    warmup=args.warmup, with_torch_compile=args.torch_compile,
                                    torch_compile_budget_s=args.torch_compile_budget))
    print(format_table(rows))
    for row in rows:
        for note in row.notes:
            print(f"note: {row.model}: {note}")
    if args.json:
        write_json(args.json, rows, args)
    return 0


def format_table(rows: list[Row]) -> str:
    return render_table(COLUMNS, [_cells(row) for row in rows])


def render_table(columns, lines) -> str:
    """A plain-text table: the first column left-aligned, the others right-aligned."""
    cells = [tuple(columns)] + [tuple(line) for line in lines]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]

    def render(line):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(line, widths)))

    return "\n".join([render(cells[0]), render(["-" * w for w in widths])]
                     + [render(line) for line in cells[1:]])


def _cells(row: Row) -> tuple[str, ...]:
    return (row.model, fmt_ms(row.eager_ms), fmt_ms(row.ember_ms), fmt_ratio(row.speedup),
            fmt_ms(row.torch_compile_ms), fmt_ratio(row.vs_torch_compile),
            fmt_err(row.max_abs_err), _int(row.graphs), _int(row.graph_breaks),
            "n/a" if row.compile_s is None else f"{row.compile_s:.2f}")


def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}" if value < 1 else f"{value:.2f}"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def fmt_err(value: float | None) -> str:
    return "n/a" if value is None else "inf" if math.isinf(value) else f"{value:.1e}"


def _int(value: int | None) -> str:
    return "n/a" if value is None else str(value)


def write_json(path: str, rows: list[Row], args: argparse.Namespace) -> None:
    report = {
        "torch": torch.__version__, "python": platform.python_version(),
        "device": args.device, "threads": torch.get_num_threads(), "backend": args.backend,
        "iters": args.iters, "warmup": args.warmup,
        "rows": [row.as_dict() for row in rows],
    }
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
