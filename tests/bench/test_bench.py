"""The benchmark harness and ``ember bench``: they run end to end and report what they claim.

Speed is never asserted here (DESIGN.md §7); only that the numbers exist and are sane.
"""
import json
import subprocess
import sys

import pytest
import torch

import ember
from ember.bench import cli, compat, harness, models

SMALL_RUN = ["--models", "mlp", "--iters", "2", "--warmup", "1", "--no-torch-compile"]


def test_cli_prints_a_table_with_the_model_row(capsys, tmp_path):
    out_json = tmp_path / "bench.json"
    assert cli.main(["bench", *SMALL_RUN, "--json", str(out_json)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("model"))
    for column in cli.COLUMNS:
        assert column in header
    (mlp_row,) = [line for line in lines if line.split()[:1] == ["mlp"]]
    cells = mlp_row.split()
    assert len(cells) == len(cli.COLUMNS)
    assert float(cells[1]) > 0                       # eager ms
    assert cells[4] == "n/a" and cells[5] == "n/a"   # torch.compile not measured

    report = json.loads(out_json.read_text())
    (row,) = report["rows"]
    assert row["model"] == "mlp" and row["torch_compile_ms"] is None
    assert row["eager_ms"] > 0 and row["ember_ms"] > 0


def test_python_dash_m_ember_bench_runs():
    done = subprocess.run([sys.executable, "-m", "ember.bench", *SMALL_RUN],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert any(line.startswith("mlp ") for line in done.stdout.splitlines())


def test_harness_measures_error_against_eager():
    row = harness.benchmark_model("mlp", "cpu", iters=2, warmup=0, with_torch_compile=False)
    assert row.max_abs_err is not None and row.max_abs_err < 1e-4
    assert row.eager_ms > 0 and row.ember_ms > 0 and row.speedup > 0
    assert row.compile_s is not None and row.compile_s >= 0
    assert row.graphs is not None and row.graph_breaks is not None
    assert row.torch_compile_ms is None and row.vs_torch_compile is None


def test_harness_counts_graphs_with_a_custom_backend():
    received = []

    def backend(gm, example_inputs):
        received.append(gm)
        return gm.forward

    row = harness.benchmark_model("mlp", backend=backend, iters=1, warmup=0,
                                  with_torch_compile=False)
    assert row.graphs == len(received)


def test_max_abs_error_walks_nested_outputs():
    a = {"x": torch.zeros(3), "rest": (torch.ones(2), [torch.full((1,), 2.0)])}
    b = {"x": torch.zeros(3), "rest": (torch.ones(2), [torch.full((1,), 2.5)])}
    assert harness.max_abs_error(a, b) == pytest.approx(0.5)
    assert harness.max_abs_error(torch.zeros(2), torch.zeros(3)) == float("inf")
    assert harness.max_abs_error((torch.zeros(2),), (torch.zeros(2), torch.zeros(2))) == \
        float("inf")


def test_unknown_model_is_a_clear_error():
    with pytest.raises(models.UnknownModelError, match=r"no_such_model.*known models: mlp"):
        harness.benchmark_model("no_such_model", with_torch_compile=False)


def test_cli_rejects_unknown_model_and_backend(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--models", "mlp,no_such_model", "--no-torch-compile"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown model(s): no_such_model" in err and "transformer_block" in err

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--models", "mlp", "--backend", "no_such_backend"])
    assert exit_info.value.code == 2
    assert "unknown backend 'no_such_backend'" in capsys.readouterr().err


def test_ember_help_lists_the_subcommands():
    done = subprocess.run([sys.executable, "-c", "import sys; from ember.bench.cli import main; "
                           "sys.exit(main())", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "commands:" in done.stdout and "bench " in done.stdout


@pytest.mark.parametrize("argv, message", [
    ([], "a COMMAND is required: bench"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_cli_without_a_known_subcommand_is_a_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_format_table_shows_missing_values_as_na():
    row = harness.Row("m", "cpu", "ember", eager_ms=2.0)
    table = cli.format_table([row])
    assert table.splitlines()[2].split() == ["m", "2.00"] + ["n/a"] * 8


@pytest.mark.parametrize("name", ["mlp", "convnet", "transformer_block"])
def test_builtin_models_are_deterministic_and_in_eval_mode(name):
    model_a, inputs_a = models.build_model(name)
    model_b, inputs_b = models.build_model(name)
    assert not model_a.training
    with torch.no_grad():
        assert torch.equal(model_a(*inputs_a), model_b(*inputs_b))


def test_build_model_leaves_the_callers_random_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    models.build_model("mlp")
    assert torch.equal(torch.rand(3), expected)


def test_default_models_are_the_installed_ones():
    names = models.available()
    assert names[:3] == ["mlp", "convnet", "transformer_block"]
    assert ("resnet18" in names) == (compat.import_timm() is not None)
    assert ("bert" in names) == (compat.import_transformers() is not None)


def test_torchvision_schemas_are_defined_once():
    if compat.import_torchvision() is None:
        pytest.skip("torchvision is not installed")
    compat.define_torchvision_schemas()   # a second call must not redefine them
    assert torch._C._jit_get_schemas_for_operator("torchvision::nms")
    assert torch._C._jit_get_schemas_for_operator("torchvision::qnms")


def test_harness_resets_ember_after_each_model():
    harness.benchmark_model("mlp", iters=1, warmup=0, with_torch_compile=False)
    assert not ember.metrics.counters["frontend"]


@pytest.mark.slow   # importing torch._dynamo and torch._inductor alone takes ~10 s here
def test_torch_compile_past_its_budget_is_skipped_with_a_note():
    row = harness.benchmark_model("mlp", iters=1, warmup=0, with_torch_compile=True,
                                  torch_compile_budget_s=0.01)
    assert row.torch_compile_ms is None
    assert any("torch-inductor skipped" in note for note in row.notes), row.notes
