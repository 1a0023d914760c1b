"""The benchmark harness and ``ember bench``: they run end to end and report what they claim.

Speed is never asserted here (DESIGN.md §7); only that the numbers exist and are sane. Runs
that need no process isolation use ``--no-isolate`` (fast, and monkeypatching reaches them);
``test_runner.py`` covers the isolated runs.
"""
import json
import re
import subprocess
import sys

import pytest
import torch

import ember
from ember.bench import accuracy, cli, compat, harness, report, zoo

SMALL_RUN = ["--models", "mlp", "--repeat", "2", "--warmup", "1", "--no-torch-compile",
             "--no-isolate"]


def cells(line: str) -> list[str]:
    """A table line's cells (columns are separated by two spaces or more)."""
    return re.split(r"\s{2,}", line.strip())


def table_row(lines: list[str], first: str) -> dict[str, str]:
    """The cells of the line starting with ``first``, by the header of its table."""
    index = next(i for i, line in enumerate(lines) if line.split()[:1] == [first])
    header = next(lines[i] for i in range(index, -1, -1)
                  if lines[i].startswith(("model ", "compiler ", "kernel ")))
    return dict(zip(cells(header), cells(lines[index])))


def test_cli_prints_a_table_with_the_model_row_and_a_geomean(capsys, tmp_path):
    out_json = tmp_path / "bench.json"
    assert cli.main(["bench", *SMALL_RUN, "--json", str(out_json)]) == 0
    lines = capsys.readouterr().out.splitlines()
    mlp = table_row(lines, "mlp")
    assert float(mlp["eager ms"]) > 0
    assert re.fullmatch(r"\d+\.\d\dx", mlp["ember"]), mlp
    assert mlp["graphs"] == "1" and mlp["breaks"] == "0" and int(mlp["kernels"]) >= 1
    assert float(mlp["ember cold s"]) > 0 and mlp["ember warm s"] == "n/a"   # not isolated
    assert "torch.compile" not in mlp
    geomean = next(line for line in lines if line.startswith("geomean"))
    assert cells(geomean)[1] == mlp["ember"]     # one model: its speedup is the geomean
    summary = table_row(lines, "ember")
    assert summary["correct"] == "1" and summary["geomean speedup"] == mlp["ember"] + " (1)"

    data = json.loads(out_json.read_text())
    (row,) = data["rows"]
    assert row["model"] == "mlp" and row["torch_compile_ms"] is None
    assert row["eager_ms"] > 0 and row["ember_ms"] > 0
    assert row["variants"]["ember"]["correct"] is True


def test_python_dash_m_ember_bench_takes_the_bench_options():
    done = subprocess.run([sys.executable, "-m", "ember.bench", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m ember.bench") and "--compare" in done.stdout


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


def test_harness_checks_results_against_a_float64_reference():
    row = harness.benchmark_model("mlp", "cpu", iters=2, warmup=0, with_torch_compile=False)
    assert row.reference_dtype == "float64"
    ember_result, eager_result = row.variants["ember"], row.variants["eager"]
    assert ember_result.correct is True and ember_result.rel_err < 1e-4
    assert eager_result.rel_err is not None and eager_result.correct is None
    assert row.max_abs_err is not None and row.max_abs_err < 1e-4
    assert row.eager_ms > 0 and row.ember_ms > 0 and row.speedup > 0
    assert row.compile_s is not None and row.compile_s >= 0
    assert ember_result.graphs == 1 and ember_result.kernels >= 1
    assert row.graphs is not None and row.graph_breaks is not None
    assert row.torch_compile_ms is None and row.vs_torch_compile is None
    assert row.peak_rss_mb > 0


def test_half_precision_rows_are_checked_against_float32():
    row = harness.benchmark_model("mlp", "cpu", iters=1, warmup=0, compilers="ember",
                                  dtype=torch.bfloat16, batch_size=4)
    assert row.reference_dtype == "float32" and row.dtype == "bfloat16"
    assert row.variants["ember"].correct is True


def test_harness_counts_graphs_with_a_custom_backend():
    received = []

    def backend(gm, example_inputs):
        received.append(gm)
        return gm.forward

    row = harness.benchmark_model("mlp", backend=backend, iters=1, warmup=0,
                                  with_torch_compile=False)
    assert row.graphs == len(received) == 1


def test_max_abs_error_walks_nested_outputs():
    a = {"x": torch.zeros(3), "rest": (torch.ones(2), [torch.full((1,), 2.0)])}
    b = {"x": torch.zeros(3), "rest": (torch.ones(2), [torch.full((1,), 2.5)])}
    assert harness.max_abs_error(a, b) == pytest.approx(0.5)
    assert harness.max_abs_error(torch.zeros(2), torch.zeros(3)) == float("inf")
    assert harness.max_abs_error((torch.zeros(2),), (torch.zeros(2), torch.zeros(2))) == \
        float("inf")


def test_accuracy_allows_eagers_own_error_and_a_dtype_floor():
    reference = torch.linspace(-1, 1, 100, dtype=torch.float64)
    eager = reference + 1e-3            # eager is itself 1e-3 off (half precision, say)
    assert accuracy.check(reference + 1.5e-3, eager, reference, torch.float32).correct
    assert not accuracy.check(reference + 5e-3, eager, reference, torch.float32).correct
    assert accuracy.check(reference + 1e-2, reference, reference, torch.bfloat16).correct
    assert not accuracy.check(reference + 1e-2, reference, reference, torch.float32).correct
    # non-finite values in the same places are equal; integer outputs must match exactly
    inf = torch.tensor([1.0, float("inf"), float("nan")])
    assert accuracy.check(inf, inf, inf.double(), torch.float32).correct
    ints = torch.arange(4)
    assert not accuracy.check(ints + 1, ints, ints, torch.float32).correct
    assert accuracy.check((ints, None), (ints, None), (ints, None), torch.float32).correct
    assert not accuracy.check((ints,), (ints, ints), (ints, ints), torch.float32).correct


def test_accuracy_requires_eagers_strides_where_indexing_reads_them():
    nchw = torch.randn(2, 3, 4, 5)
    nhwc = nchw.contiguous(memory_format=torch.channels_last)
    verdict = accuracy.check(nhwc, nchw, nchw.double(), torch.float32)
    assert not verdict.correct and verdict.rel_err == 0.0
    assert verdict.strides == "output 0 has strides (60, 1, 15, 3), eager's (60, 20, 5, 1)"
    # a size-1 dim's stride is never read: (2, 3, 1, 1) tensors match in either layout
    pooled = nchw[:, :, :1, :1].contiguous()
    assert accuracy.check(pooled.contiguous(memory_format=torch.channels_last), pooled,
                          pooled.double(), torch.float32).correct


def test_unknown_model_is_a_clear_error():
    with pytest.raises(zoo.UnknownModelError, match=r"no_such_model.*known models: mlp"):
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
    assert "--backend: unknown backend 'no_such_backend'" in capsys.readouterr().err


def test_model_table_shows_missing_values_as_na():
    row = harness.Row("m", "cpu", "ember", eager_ms=2.0)
    row.variants = {"eager": harness.Variant(ms=2.0), "ember": harness.Variant()}
    line = report.format_model_table([row], ("eager", "ember")).splitlines()[2]
    assert cells(line) == ["m", "2.00"] + ["n/a"] * 9


@pytest.mark.parametrize("name", zoo.in_suite("builtin"))
def test_builtin_models_are_deterministic_and_in_eval_mode(name):
    model_a, inputs_a = zoo.build_model(name)
    model_b, inputs_b = zoo.build_model(name)
    assert not model_a.training
    with torch.no_grad():
        assert torch.equal(model_a(*inputs_a), model_b(*inputs_b))


def test_build_model_leaves_the_callers_random_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    zoo.build_model("mlp")
    assert torch.equal(torch.rand(3), expected)


def test_train_mode_models_train_without_dropout():
    model, _ = zoo.build_model("transformer_block", mode="train")
    assert model.training
    if zoo.is_available("vit_tiny"):
        model, _ = zoo.build_model("vit_tiny", mode="train")
        dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
        assert dropouts and all(m.p == 0.0 for m in dropouts)


def test_training_loss_has_gradients_through_a_final_layer_norm():
    """A plain sum of a layer norm's outputs is constant (each row sums to zero), so every
    gradient below it would be rounding noise; the training step's loss weights the outputs
    and gives the layers below real gradients."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16))
    out = model(torch.randn(4, 8))
    out.sum().backward(retain_graph=True)
    assert model[0].weight.grad.abs().max() < 1e-5        # the plain sum: nothing
    model.zero_grad()
    harness._loss(out).backward()
    assert model[0].weight.grad.abs().max() > 1e-2


def test_builtin_suite_needs_only_torch_and_the_others_their_package():
    assert zoo.in_suite("builtin") == ["mlp", "convnet", "transformer_block", "tiny_gpt"]
    assert all(zoo.MODELS[n].requires is None for n in zoo.in_suite("builtin"))
    for suite, package in (("timm", "timm"), ("hf", "transformers"),
                           ("torchvision", "torchvision")):
        names = zoo.in_suite(suite)
        assert len(names) >= 10, suite
        assert {zoo.MODELS[n].requires for n in names} == {package}


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
