"""benchmarks/backend.py runs end to end and reports what it claims.

Speed is never asserted (DESIGN.md §7); only that the rows exist, the numbers are sane and
Ember's outputs match eager.
"""
import json

import pytest

from benchmark_scripts import loaded

SMALL_RUN = ["--rows", "pointwise,softmax", "--iters", "2", "--warmup", "1",
             "--no-torch-compile", "--small"]


@pytest.fixture(scope="module")
def backend_bench():
    with loaded("backend") as module:
        yield module


def test_speed_table_has_the_rows_and_small_errors(backend_bench, capsys, tmp_path):
    out_json = tmp_path / "backend.json"
    assert backend_bench.main([*SMALL_RUN, "--no-compile-times", "--json", str(out_json)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("row "))
    for column in backend_bench.SPEED_COLUMNS:
        assert column in header
    for name in ("pointwise", "softmax"):
        (line,) = [line for line in lines if line.split()[:1] == [name]]
        cells = line.split()
        assert len(cells) == len(backend_bench.SPEED_COLUMNS)
        assert float(cells[1]) > 0 and float(cells[2]) > 0       # eager ms, ember ms
        assert cells[3] == "n/a" and cells[5] == "n/a"           # torch.compile not run
        assert float(cells[4].rstrip("x")) > 0                   # eager/ember
        assert float(cells[6]) < 1e-4                            # ember err
    assert not any("ember cold s" in line for line in lines)     # --no-compile-times

    report = json.loads(out_json.read_text())
    assert [row["row"] for row in report["rows"]] == ["pointwise", "softmax"]
    for row in report["rows"]:
        assert row["eager_ms"] > 0 and row["ember_ms"] > 0
        assert row["ember_err"] is not None and row["ember_err"] < 1e-4
        assert row["torch_compile_ms"] is None and row["torch_compile_err"] is None
        assert row["notes"] == []
    assert report["compile_times"] == [] and report["small"] is True


def test_small_sizes_are_sixteen_times_smaller(backend_bench):
    for name in ("pointwise", "softmax", "layer_norm"):
        build = backend_bench.ROWS[name].build
        (_, full), (_, small) = build(False), build(True)
        assert full[0].numel() == 16 * small[0].numel()


def test_unknown_row_is_a_usage_error(backend_bench):
    with pytest.raises(SystemExit) as exc:
        backend_bench.main(["--rows", "pointwise,nope"])
    assert exc.value.code == 2


def test_compile_times_run_in_fresh_processes(backend_bench, capsys):
    # One row, Ember only: a cold and a warm process (a few seconds each).
    assert backend_bench.main(["--rows", "pointwise", "--iters", "1", "--warmup", "0",
                               "--no-torch-compile", "--small"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "ember cold s" in line)
    assert "ember warm s" in header and "torch.compile" not in header
    rows = [line.split() for line in lines[lines.index(header):]
            if line.split()[:1] == ["pointwise"]]
    assert len(rows) == 1 and len(rows[0]) == 3
    assert float(rows[0][1]) > 0 and float(rows[0][2]) > 0
    assert not any(line.startswith("note:") for line in lines)
