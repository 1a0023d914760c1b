"""What ``ember bench`` shows and saves: tables, geomeans, JSON, CSV, the speedup chart, and the
comparison of two saved runs.

Decisions:

- Tables are rendered with rich (the ``bench`` extra) as plain text without colour, so they
  read the same in a terminal, a log file and the README; without rich, a small built-in
  renderer draws the same columns.
- A speedup is eager's median time over the variant's. The geomean speedup of a compiler is
  taken over the model rows where it was timed and its result was correct (a wrong result's
  time is not a speedup worth counting); the summary table says how many rows that is.
- JSON (``results.json``) holds the run's settings and every row as
  ``harness.Row.as_dict()``; CSV (``results.csv``) has one line per row and variant, the shape
  that spreadsheets and pandas want. Both are rewritten after every row, so a run cut short
  keeps what it finished. The chart (``speedups.png``) has one group of bars per model, one
  bar per compiler; matplotlib is imported only to draw it, with its non-interactive backend.
- ``--compare A.json B.json`` lines up the rows of two runs by model and compiler: each
  variant's time in A and B and ``A ms / B ms`` (above 1: B is faster), with a geomean per
  compiler, and says which results changed correctness or exist in one run only.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import statistics
from typing import Any, Callable, Iterable

from ember.bench.harness import Row, label

# Row statuses of rows that were measured (the others: "not run", "interrupted", "skipped").
FINISHED = ("ok", "error", "crashed", "timeout")

SCHEMA_VERSION = 2
Column = tuple[str, Callable[[Row], str]]


# ------------------------------------------------------------------------------ formatting

def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}" if value < 1 else f"{value:.2f}"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def fmt_err(value: float | None) -> str:
    return "n/a" if value is None else "inf" if math.isinf(value) else f"{value:.1e}"


def fmt_seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def fmt_mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def fmt_int(value: int | None) -> str:
    return "n/a" if value is None else str(value)


def fmt_gbps(value: float | None, fraction: float | None = None) -> str:
    """``812`` GB/s, with the fraction of copy's as ``812 (73%)`` when given."""
    if value is None:
        return "n/a"
    text = f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return text if fraction is None else f"{text} ({fraction:.0%})"


def render_table(columns: Iterable[str], lines: Iterable[Iterable[str]]) -> str:
    """A text table: the first column left-aligned, the others right-aligned."""
    columns, lines = list(columns), [list(line) for line in lines]
    try:
        from rich import box
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        return _plain_table(columns, lines)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right", no_wrap=True)
    for line in lines:
        table.add_row(*line)
    console = Console(file=io.StringIO(), width=10_000, color_system=None)
    console.print(table)
    return console.file.getvalue().rstrip("\n")


def _plain_table(columns: list[str], lines: list[list[str]]) -> str:
    cells = [columns] + lines
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]

    def render(line):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(line, widths))).rstrip()

    return "\n".join([render(columns), "-" * len(render(["-" * w for w in widths]))]
                     + [render(line) for line in lines])


# ------------------------------------------------------------------------------ the tables

def speedup_cell(row: Row, variant: str) -> str:
    """``1.23x``, ``0.91x wrong`` (timed but incorrect), or why there is no time."""
    result = row.variants.get(variant)
    if row.status != "ok":
        return row.status
    if result is None:
        return "n/a"
    speedup = row.speedup_of(variant)
    if speedup is None:
        error = result.error or ""
        return "skipped" if error.startswith("skipped") else "failed" if error else "n/a"
    return fmt_ratio(speedup) + (" wrong" if result.correct is False else "")


def compiled(compilers: Iterable[str]) -> list[str]:
    return [v for v in compilers if v != "eager"]


def model_columns(compilers: Iterable[str], device: str = "cpu") -> list[Column]:
    """One line per model: eager's time, each compiler's speedup, then Ember's details."""
    compilers = list(compilers)
    ember = next((v for v in compilers if v.startswith("ember")), None)
    columns: list[Column] = [("model", lambda r: r.model),
                             ("eager ms", lambda r: fmt_ms(r.eager_ms))]
    columns += [(label(v), lambda r, v=v: speedup_cell(r, v)) for v in compiled(compilers)]
    if ember is not None:
        name = label(ember)
        get = (lambda r, key: getattr(r.variants[ember], key) if ember in r.variants else None)
        columns += [
            # eager's own error against the reference beside Ember's: a large error is
            # judged next to it (accuracy.py: within 2x eager's, plus the dtype's floor)
            ("eager err", lambda r: fmt_err(r.variants["eager"].rel_err
                                            if "eager" in r.variants else None)),
            (f"{name} err", lambda r: fmt_err(get(r, "rel_err"))),
            (f"{name} cold s", lambda r: fmt_seconds(get(r, "first_call_s"))),
            (f"{name} warm s", lambda r: fmt_seconds(get(r, "warm_compile_s"))),
        ]
        columns += [(f"{label(v)} cold s", lambda r, v=v: fmt_seconds(
            r.variants[v].first_call_s if v in r.variants else None))
            for v in compiled(compilers) if not v.startswith("ember")]
        columns += [
            ("graphs", lambda r: fmt_int(get(r, "graphs"))),
            ("breaks", lambda r: fmt_int(get(r, "graph_breaks"))),
            ("kernels", lambda r: fmt_int(get(r, "kernels"))),
        ]
    if device == "cuda":
        # peak memory of one call: eager's in MB, each compiler's against it
        columns.append(("eager MB", lambda r: fmt_mb(
            r.variants["eager"].peak_mem_mb if "eager" in r.variants else None)))
        columns += [(f"{label(v)} mem", lambda r, v=v: fmt_ratio(r.memory_vs_eager(v)))
                    for v in compiled(compilers)]
    columns.append(("RSS MB", lambda r: fmt_mb(r.peak_rss_mb)))
    return columns


def geomean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def geomean_speedup(rows: list[Row], variant: str) -> float | None:
    """Over the model rows where ``variant`` was timed and correct."""
    return geomean(row.speedup_of(variant) for row in _counted(rows, variant))


def _counted(rows: list[Row], variant: str) -> list[Row]:
    return [row for row in rows if row.kind == "model" and variant in row.variants
            and row.speedup_of(variant) is not None
            and row.variants[variant].correct is not False]


def format_model_table(rows: list[Row], compilers: Iterable[str], device: str = "cpu") -> str:
    columns = model_columns(compilers, device)
    lines = [[cell(row) for _, cell in columns] for row in rows]
    total = [""] * len(columns)
    total[0] = "geomean"
    for i, (name, _) in enumerate(columns):
        for variant in compiled(compilers):
            if name == label(variant):
                total[i] = fmt_ratio(geomean_speedup(rows, variant))
    return render_table([name for name, _ in columns], lines + [total])


def summary(rows: list[Row], compilers: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per compiled variant over the model rows that finished (``not_run``: the rows that did
    not): counts, geomean speedup, median compile times, CUDA peak memory (median MB, and the
    geomean of its ratio to eager's)."""
    out = {}
    model_rows = [row for row in rows if row.kind == "model" and row.status in FINISHED]
    not_run = sum(1 for row in rows if row.kind == "model" and row.status not in FINISHED)
    for variant in compiled(compilers):
        results = [row.variants[variant] for row in model_rows if variant in row.variants]
        out[variant] = {
            "models": len(results),
            "not_run": not_run,
            "timed": sum(1 for row in model_rows if row.speedup_of(variant) is not None),
            "correct": sum(1 for r in results if r.correct),
            "wrong": sum(1 for r in results if r.correct is False),
            "failed": sum(1 for r in results if r.error),
            "geomean_speedup": geomean_speedup(rows, variant),
            "geomean_over": len(_counted(rows, variant)),
            "median_cold_compile_s": _median(r.first_call_s for r in results),
            "median_warm_compile_s": _median(r.warm_compile_s for r in results),
            "median_peak_mem_mb": _median(r.peak_mem_mb for r in results),
            "geomean_mem_vs_eager": geomean(row.memory_vs_eager(variant)
                                            for row in model_rows),
        }
    return out


def _median(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def format_summary(rows: list[Row], compilers: Iterable[str]) -> str:
    columns = ["compiler", "models", "correct", "wrong", "failed", "geomean speedup",
               "cold compile s", "warm compile s", "peak MB", "mem vs eager"]
    lines = [[label(variant), str(s["models"]), str(s["correct"]), str(s["wrong"]),
              str(s["failed"]),
              f"{fmt_ratio(s['geomean_speedup'])} ({s['geomean_over']})",
              fmt_seconds(s["median_cold_compile_s"]), fmt_seconds(s["median_warm_compile_s"]),
              fmt_mb(s["median_peak_mem_mb"]), fmt_ratio(s["geomean_mem_vs_eager"])]
             for variant, s in summary(rows, compilers).items()]
    if any(s["not_run"] for s in summary(rows, compilers).values()):
        columns.append("not run")
        for line, s in zip(lines, summary(rows, compilers).values()):
            line.append(str(s["not_run"]))
    return render_table(columns, lines)


def kernel_columns(compilers: Iterable[str]) -> list[Column]:
    columns: list[Column] = [
        ("kernel", lambda r: r.model),
        ("MB moved", lambda r: "n/a" if r.bytes_moved is None else f"{r.bytes_moved / 1e6:.1f}"),
        ("copy GB/s", lambda r: fmt_gbps(r.copy_gbps)),
    ]
    for variant in compilers:
        columns.append((f"{label(variant)} GB/s",
                        lambda r, v=variant: fmt_gbps(r.gbps(v), r.fraction_of_copy(v))))
    columns.append(("ember err", lambda r: fmt_err(r.max_abs_err)))
    return columns


def format_kernel_table(rows: list[Row], compilers: Iterable[str]) -> str:
    """The kernel table: GB/s of copy_ and of each variant, with its fraction of copy's."""
    columns = kernel_columns(compilers)
    return render_table([c for c, _ in columns], [[cell(row) for _, cell in columns]
                                                  for row in rows])


def format_report(rows: list[Row], compilers: Iterable[str], device: str = "cpu") -> str:
    """The kernel table, the model table with its geomeans, the per-compiler summary, one line
    per row saying what it ran, and the notes."""
    compilers = list(compilers)
    parts = []
    kernel_rows = [row for row in rows if row.kind == "kernel"]
    model_rows = [row for row in rows if row.kind != "kernel"]
    if kernel_rows:
        parts.append(format_kernel_table(kernel_rows, compilers))
    if model_rows:
        parts.append(format_model_table(model_rows, compilers, device))
        if compiled(compilers):
            parts.append(format_summary(model_rows, compilers))
    lines = ["\n\n".join(parts)]
    for row in rows:
        if row.inputs:
            what = [row.dtype or "?"] + ([f"autocast {row.amp}"] if row.amp else [])
            if row.bytes_moved:
                what.append(f"{row.bytes_moved / 1e6:.1f} MB moved per call")
            if row.batch_size:
                what.append(f"batch {row.batch_size}")
            lines.append(f"  {row.model}: {', '.join(what)}; inputs {', '.join(row.inputs)}")
    for row in rows:
        for note in row.notes:
            lines.append(f"note: {row.model}: {note}")
    return "\n".join(lines)


# ----------------------------------------------------------------------- JSON, CSV, chart

def report_dict(rows: list[Row], settings: dict[str, Any], compilers: Iterable[str]) -> dict:
    compilers = list(compilers)
    return {"schema": SCHEMA_VERSION, **settings, "compilers": compilers,
            "geomean_speedup": {v: geomean_speedup(rows, v) for v in compiled(compilers)},
            "summary": summary(rows, compilers),
            "rows": [row.as_dict() for row in rows]}


def write_json(path: str, report: dict) -> None:
    with _replacing(path) as f:
        json.dump(report, f, indent=2)
        f.write("\n")


@contextlib.contextmanager
def _replacing(path: str, **open_args):
    """Write ``path`` through a temporary file renamed over it: a run killed while it writes
    leaves the previous version whole, never half a file."""
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with open(temporary, "w", **open_args) as f:
            yield f
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


CSV_FIELDS = ("model", "suite", "kind", "mode", "dtype", "batch_size", "status", "compiler",
              "ms", "speedup", "correct", "rel_err", "max_abs_err", "cold_compile_s",
              "warm_compile_s", "graphs", "graph_breaks", "kernels", "fallbacks",
              "peak_mem_mb", "peak_rss_mb", "error")


def write_csv(path: str, rows: list[Row]) -> None:
    """One line per row and variant."""
    with _replacing(path, newline="") as f:
        writer = csv.DictWriter(f, CSV_FIELDS)
        writer.writeheader()
        for row in rows:
            for name, v in row.variants.items():
                writer.writerow({
                    "model": row.model, "suite": row.suite, "kind": row.kind,
                    "mode": row.mode, "dtype": row.dtype, "batch_size": row.batch_size,
                    "status": row.status, "compiler": name, "ms": row.ms(name),
                    "speedup": row.speedup_of(name), "correct": v.correct,
                    "rel_err": v.rel_err, "max_abs_err": v.max_abs_err,
                    "cold_compile_s": v.first_call_s, "warm_compile_s": v.warm_compile_s,
                    "graphs": v.graphs, "graph_breaks": v.graph_breaks, "kernels": v.kernels,
                    "fallbacks": v.fallbacks, "peak_mem_mb": v.peak_mem_mb,
                    "peak_rss_mb": row.peak_rss_mb, "error": v.error or row.error})


def write_chart(path: str, rows: list[Row], compilers: Iterable[str], title: str) -> None:
    """A PNG bar chart of each model's speedup per compiler (a line at 1: eager)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    variants = compiled(compilers)
    model_rows = [row for row in rows if row.kind == "model"]
    width = 0.8 / max(len(variants), 1)
    figure, axes = pyplot.subplots(figsize=(max(6.0, 0.45 * len(model_rows) * max(
        len(variants), 1) + 2), 4.8))
    for i, variant in enumerate(variants):
        heights = [row.speedup_of(variant) or 0.0 for row in model_rows]
        positions = [j + (i - (len(variants) - 1) / 2) * width for j in range(len(model_rows))]
        mean = geomean_speedup(model_rows, variant)
        axes.bar(positions, heights, width, label=f"{label(variant)} (geomean "
                                                  f"{fmt_ratio(mean)})")
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(model_rows)))
    axes.set_xticklabels([row.model for row in model_rows], rotation=60, ha="right",
                         fontsize=8)
    axes.set_ylabel("speedup over eager (higher is better)")
    axes.set_title(title, fontsize=10)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


# -------------------------------------------------------------------------------- compare

def load_rows(path: str) -> tuple[dict, list[Row]]:
    with open(path) as f:
        report = json.load(f)
    if not isinstance(report, dict) or not isinstance(report.get("rows"), list):
        raise ValueError(f"{path}: not an ember bench JSON file (no 'rows' list)")
    return report, [Row.from_dict(row) for row in report["rows"]]


def format_compare(path_a: str, path_b: str) -> str:
    """Per model and compiler: A's and B's median ms and ``A ms / B ms``; geomeans; notes."""
    (_, rows_a), (_, rows_b) = load_rows(path_a), load_rows(path_b)
    by_model_a = {row.model: row for row in rows_a}
    by_model_b = {row.model: row for row in rows_b}
    lines, ratios, notes = [], {}, []
    for model, row_b in by_model_b.items():
        row_a = by_model_a.get(model)
        if row_a is None:
            notes.append(f"note: {model}: only in B")
            continue
        for variant in row_b.variants:
            if variant not in row_a.variants:
                continue
            ms_a, ms_b = row_a.ms(variant), row_b.ms(variant)
            ratio = ms_a / ms_b if ms_a and ms_b else None
            if ratio is not None:
                ratios.setdefault(variant, []).append(ratio)
            lines.append([model, label(variant), fmt_ms(ms_a), fmt_ms(ms_b), fmt_ratio(ratio),
                          fmt_ratio(row_a.speedup_of(variant)),
                          fmt_ratio(row_b.speedup_of(variant))])
            correct_a, correct_b = (row_a.variants[variant].correct,
                                    row_b.variants[variant].correct)
            if correct_a is not correct_b and variant != "eager":
                notes.append(f"note: {model}: {variant} correct in A: {correct_a}, "
                             f"in B: {correct_b}")
    notes += [f"note: {model}: only in A" for model in by_model_a if model not in by_model_b]
    for variant, values in ratios.items():
        lines.append(["geomean", label(variant), "", "", fmt_ratio(geomean(values)), "", ""])
    table = render_table(["model", "compiler", "A ms", "B ms", "A/B", "A speedup",
                          "B speedup"], lines)
    header = (f"A: {path_a}\nB: {path_b}\nA/B: A's median ms over B's (above 1: B is "
              f"faster); speedups are over eager in the same run")
    return "\n".join([header, "", table, *notes])
