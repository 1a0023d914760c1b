"""``ember bench`` as users run it: each model in its own process, users' models and
compilers given as ``module:callable``, crashes and hangs, the files under ``--out`` and
``--compare``.

Models here are tiny (``bench_fakes.py``); speed is never asserted, only that every number
and file exists and says what it claims.
"""
import csv
import json
import os
import re
import subprocess
import sys

import pytest

from ember.bench import cli, harness, report

FAST = ["--repeat", "2", "--warmup", "1"]


def cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def run(argv, capsys, failed: str | None = None) -> list[str]:
    """The run's stdout lines. ``failed``: the stderr line naming the rows that failed or
    were wrong, when the run must exit 1; without, it must exit 0 and name none."""
    status = cli.main(["bench", *argv])
    captured = capsys.readouterr()
    summary = [line for line in captured.err.splitlines() if line.startswith("ember bench: ")]
    if failed is None:
        assert status == 0 and not summary, summary
    else:
        assert status == cli.EXIT_FAILED == 1 and summary == [failed], (status, summary)
    return captured.out.splitlines()


def model_line(lines: list[str], model: str) -> dict[str, str]:
    header = cells(next(line for line in lines if line.startswith("model ")))
    (line,) = [line for line in lines if line.startswith(model + " ")]
    return dict(zip(header, cells(line)))


def test_user_model_isolated_with_cold_and_warm_compile_and_out_files(capsys, tmp_path):
    out = tmp_path / "run"
    lines = run(["--models", "bench_fakes:tiny", "--compilers", "ember", *FAST,
                 "--out", str(out)], capsys)
    row = model_line(lines, "bench_fakes:tiny")
    assert row["ember"].endswith("x") and float(row["ember cold s"]) > 0
    assert float(row["ember warm s"]) > 0 and row["graphs"] == "1"

    data = json.loads((out / "results.json").read_text())
    for key in ("schema", "torch", "python", "device", "mode", "repeat", "warmup", "timer",
                "compilers", "isolated", "timeout_s", "geomean_speedup", "summary", "rows"):
        assert key in data, key
    assert data["schema"] == report.SCHEMA_VERSION and data["isolated"] is True
    assert data["compilers"] == ["eager", "ember"]
    (row,) = data["rows"]
    for key in ("model", "suite", "kind", "mode", "dtype", "status", "error", "inputs",
                "reference_dtype", "peak_rss_mb", "notes", "variants", "eager_ms", "speedup"):
        assert key in row, key
    assert row["status"] == "ok" and row["reference_dtype"] == "float64"
    ember_result = row["variants"]["ember"]
    for key in ("ms", "host_ms", "speedup", "first_call_s", "warm_compile_s", "correct",
                "rel_err", "max_abs_err", "graphs", "graph_breaks", "kernels", "fallbacks",
                "peak_mem_mb", "error"):
        assert key in ember_result, key
    assert ember_result["correct"] is True and ember_result["warm_compile_s"] > 0
    assert data["geomean_speedup"]["ember"] == pytest.approx(ember_result["speedup"])
    assert harness.Row.from_dict(row).as_dict() == row      # the JSON round-trips

    with open(out / "results.csv") as f:
        lines = list(csv.DictReader(f))
    assert [(r["model"], r["compiler"]) for r in lines] == [("bench_fakes:tiny", "eager"),
                                                            ("bench_fakes:tiny", "ember")]
    assert float(lines[1]["speedup"]) == pytest.approx(ember_result["speedup"])

    png = (out / "speedups.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    from PIL import Image
    with Image.open(out / "speedups.png") as image:
        assert image.format == "PNG" and image.size[0] > 100
    assert (out / "logs" / "bench_fakes_tiny.log").exists()


def test_a_crashing_model_costs_only_itself(capsys, tmp_path):
    lines = run(["--models", "bench_fakes:crashing,bench_fakes:tiny", "--compilers", "ember",
                 *FAST, "--no-warm-compile", "--json", str(tmp_path / "r.json")], capsys,
                failed="ember bench: 1 of 2 rows failed or were wrong: "
                       "bench_fakes:crashing (crashed)")
    assert model_line(lines, "bench_fakes:crashing")["ember"] == "crashed"
    assert model_line(lines, "bench_fakes:tiny")["ember"].endswith("x")
    assert "note: bench_fakes:crashing: crashed: killed by SIGABRT (building)" in lines
    rows = {r["model"]: r for r in json.loads((tmp_path / "r.json").read_text())["rows"]}
    assert rows["bench_fakes:crashing"]["status"] == "crashed"
    assert rows["bench_fakes:tiny"]["status"] == "ok"


def test_a_hanging_model_times_out_and_the_run_goes_on(capsys):
    # The model after the hang crashes at once: it shows that the run went on, and needs no
    # time of its own under the short timeout.
    lines = run(["--models", "bench_fakes:hanging,bench_fakes:crashing", "--compilers",
                 "ember", *FAST, "--timeout", "2"], capsys,
                failed="ember bench: 2 of 2 rows failed or were wrong: "
                       "bench_fakes:hanging (timeout); bench_fakes:crashing (crashed)")
    assert model_line(lines, "bench_fakes:hanging")["ember"] == "timeout"
    assert model_line(lines, "bench_fakes:crashing")["ember"] == "crashed"
    assert "note: bench_fakes:hanging: timed out after 2 s (building)" in lines


def test_slow_failing_and_wrong_compilers_are_columns(capsys):
    lines = run(["--models", "bench_fakes:tiny", *FAST, "--no-isolate", "--compilers",
                 "ember,bench_fakes:slow_compiler,bench_fakes:failing_compiler,"
                 "bench_fakes:wrong_compiler"], capsys,
                failed="ember bench: 1 of 1 rows failed or were wrong: bench_fakes:tiny "
                       "(bench_fakes:failing_compiler failed, bench_fakes:wrong_compiler "
                       "wrong)")
    row = model_line(lines, "bench_fakes:tiny")
    assert row["ember"].endswith("x")
    assert row["slow_compiler"].endswith("x")
    assert row["failing_compiler"] == "failed"
    assert row["wrong_compiler"].endswith("x wrong")
    assert ("note: bench_fakes:tiny: bench_fakes:failing_compiler failed: RuntimeError: this "
            "compiler always fails") in lines
    summary = {cells(line)[0]: cells(line) for line in lines
               if line.startswith(("slow_compiler", "failing_compiler", "wrong_compiler"))}
    assert summary["wrong_compiler"][3] == "1"          # wrong: 1
    assert summary["failing_compiler"][4] == "1"        # failed: 1
    assert summary["wrong_compiler"][5] == "n/a (0)"    # a wrong result has no speedup


def test_slow_compiler_time_is_part_of_its_first_call():
    row = harness.benchmark_model("bench_fakes:tiny", iters=1, warmup=0,
                                  compilers="bench_fakes:slow_compiler")
    slow = row.variants["bench_fakes:slow_compiler"]
    assert slow.first_call_s >= 0.5 and slow.correct is True
    assert slow.graphs is None          # counted for Ember's variants only


def test_train_mode_checks_gradients(capsys):
    lines = run(["--models", "bench_fakes:keywords,convnet", "--batch-size", "2", *FAST,
                 "--no-isolate", "--mode", "train", "--compilers",
                 "ember,bench_fakes:no_grad_compiler"], capsys,
                failed="ember bench: 2 of 2 rows failed or were wrong: bench_fakes:keywords "
                       "(bench_fakes:no_grad_compiler wrong); convnet "
                       "(bench_fakes:no_grad_compiler wrong)")
    assert model_line(lines, "convnet")["ember"].endswith("x")
    tiny = model_line(lines, "bench_fakes:keywords")
    assert tiny["ember"].endswith("x") and not tiny["ember"].endswith("wrong")
    assert tiny["no_grad_compiler"].endswith("x wrong")   # right outputs, no gradients


def test_user_model_from_a_file_with_keyword_inputs_and_batch_size(capsys, tmp_path):
    path = os.path.join(os.path.dirname(__file__), "bench_fakes.py")
    lines = run(["--models", f"{path}:keywords", "--batch-size", "5", "--compilers", "ember",
                 *FAST, "--no-isolate"], capsys)
    assert model_line(lines, f"{path}:keywords")["ember"].endswith("x")
    assert f"  {path}:keywords: float32, batch 5; inputs 5x8 float32, 5x1 float32" in lines


def test_batch_size_for_a_model_without_that_parameter_is_an_error_row(capsys):
    lines = run(["--models", "bench_fakes:tiny", "--batch-size", "5", "--compilers", "ember",
                 *FAST, "--no-isolate"], capsys,
                failed="ember bench: 1 of 1 rows failed or were wrong: bench_fakes:tiny (error)")
    assert ("note: bench_fakes:tiny: not measured: ValueError: --batch-size: bench_fakes:tiny "
            "takes no batch_size parameter") in lines


def _saved_run(path, ember_ms: float, correct: bool = True, extra_model: str | None = None):
    rows = []
    for model in ["a", "b"] + ([extra_model] if extra_model else []):
        row = harness.Row(model, "cpu", "ember", eager_ms=2.0, ember_ms=ember_ms)
        row.variants = {"eager": harness.Variant(ms=2.0),
                        "ember": harness.Variant(ms=ember_ms, correct=correct)}
        rows.append(row)
    report.write_json(str(path), report.report_dict(rows, {"device": "cpu"},
                                                    ("eager", "ember")))


def test_compare_prints_per_model_ratios(capsys, tmp_path):
    _saved_run(tmp_path / "a.json", ember_ms=1.0)
    _saved_run(tmp_path / "b.json", ember_ms=0.5, correct=False, extra_model="c")
    lines = run(["--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")], capsys)
    header = cells(next(line for line in lines if line.startswith("model ")))
    assert header == ["model", "compiler", "A ms", "B ms", "A/B", "A speedup", "B speedup"]
    rows = [cells(line) for line in lines if line.split()[:1] in (["a"], ["b"])]
    assert ["a", "ember", "1.00", "0.500", "2.00x", "2.00x", "4.00x"] in rows
    assert ["a", "eager", "2.00", "2.00", "1.00x", "1.00x", "1.00x"] in rows
    assert ["geomean", "ember", "2.00x"] in [cells(line) for line in lines]
    assert "note: c: only in B" in lines
    assert "note: a: ember correct in A: True, in B: False" in lines


def test_compare_rejects_a_file_that_is_not_a_run(capsys, tmp_path):
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--compare", str(tmp_path / "x.json"), str(tmp_path / "x.json")])
    assert exit_info.value.code == 2
    assert "not an ember bench JSON file" in capsys.readouterr().err


def test_models_past_the_runs_budget_are_skipped_rows(capsys):
    # skipped on purpose: not a failure (the run exits 0)
    lines = run(["--models", "bench_fakes:slow_model,mlp", "--compilers", "ember", *FAST,
                 "--no-isolate", "--budget", "0.1"], capsys)
    assert model_line(lines, "bench_fakes:slow_model")["ember"].endswith("x")
    assert model_line(lines, "mlp")["ember"] == "skipped"
    assert "note: mlp: not run: the run's --budget of 0.1 s was spent" in lines


def test_without_matplotlib_the_run_says_the_chart_is_not_drawn(capsys, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)    # import matplotlib fails
    lines = run(["--models", "bench_fakes:tiny", "--compilers", "ember", *FAST, "--no-isolate",
                 "--out", str(tmp_path)], capsys)
    assert any(line.startswith("# speedups.png not drawn: ") for line in lines)
    assert f"# wrote results.json, results.csv, run.log to {tmp_path}" in lines
    assert not (tmp_path / "speedups.png").exists()


def test_exit_status_is_1_when_a_row_failed_or_was_wrong(capsys, tmp_path):
    """Scripts and CI read the status: 0 only when every selected row was measured right;
    1 (and one stderr line naming the rows) when one failed or computed a wrong result."""
    run(["--models", "bench_fakes:tiny", "--compilers", "ember", *FAST, "--no-isolate"],
        capsys)
    run(["--models", "bench_fakes:tiny,mlp", *FAST, "--no-isolate", "--compilers",
         "bench_fakes:wrong_compiler"], capsys,
        failed="ember bench: 2 of 2 rows failed or were wrong: bench_fakes:tiny "
               "(bench_fakes:wrong_compiler wrong); mlp (bench_fakes:wrong_compiler wrong)")
    run(["--models", "bench_fakes:tiny", *FAST, "--no-isolate", "--compilers",
         "bench_fakes:failing_compiler"], capsys,
        failed="ember bench: 1 of 1 rows failed or were wrong: bench_fakes:tiny "
               "(bench_fakes:failing_compiler failed)")
    done = subprocess.run([sys.executable, "-m", "ember.bench", "--models",
                           "bench_fakes:tiny", *FAST, "--no-isolate", "--compilers",
                           "bench_fakes:wrong_compiler"],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              [os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])))
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "ember bench: 1 of 1 rows failed or were wrong: bench_fakes:tiny "
        "(bench_fakes:wrong_compiler wrong)")
