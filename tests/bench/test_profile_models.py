"""benchmarks/profile_models.py runs end to end on the CPU (its smoke-test device) and keeps
going past a model or a compiler that fails.

Speed is never asserted (DESIGN.md §7). torch.compile is left out (``--no-torch-compile``):
importing torch._dynamo alone takes ~10 s here; its path is harness.compile_peer's, tested with
the bench harness.
"""
import pytest

from benchmark_scripts import loaded

SMALL_RUN = ["--device", "cpu", "--dtype", "float32", "--batch-size", "2", "--iters", "2",
             "--warmup", "1", "--profile-iters", "1", "--rows", "3", "--no-torch-compile"]


@pytest.fixture(scope="module")
def profiler():
    with loaded("profile_models") as module:
        yield module


def rows_of(markdown: str, first_cell: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in markdown.splitlines() if line.startswith(f"| {first_cell} |")]


def test_report_has_times_kernels_and_failures_and_goes_on(profiler, tmp_path, monkeypatch):
    compile_ = profiler.ember.compile

    def compile_failing_on_convnet(model, **kwargs):
        if type(model).__name__ == "ConvNet":
            raise RuntimeError("boom in the compiler")
        return compile_(model, **kwargs)

    monkeypatch.setattr(profiler.ember, "compile", compile_failing_on_convnet)
    out = tmp_path / "profile.md"
    assert profiler.main(["no_such_model,mlp,convnet", *SMALL_RUN, "--out", str(out)]) == 0
    text = out.read_text()
    summary = text.split("## Summary")[1].split("\n## ")[0]

    # a model that cannot be built is reported, and the next ones still run
    (unknown,) = rows_of(summary, "no_such_model")
    assert "failed: building failed: UnknownModelError" in unknown[2]
    # columns: model, inputs, eager ms, ember ms, ember vs eager, launches/call, compile s
    (mlp,) = rows_of(summary, "mlp")
    assert mlp[1] == "2x512 float32"
    assert float(mlp[2]) > 0 and float(mlp[3]) > 0 and float(mlp[5]) >= 1
    # Ember's failure on convnet is its row's alone: eager is still measured
    (convnet,) = rows_of(summary, "convnet")
    assert float(convnet[2]) > 0 and convnet[3] == "n/a"

    mlp_section = text.split("## mlp")[1].split("\n## ")[0]
    (ember,) = rows_of(mlp_section, "ember")
    assert float(ember[4]) < 1e-4         # relative error against eager
    kernel_rows = [rows_of(mlp_section, str(i)) for i in (1, 2, 3)]
    assert all(len(r) == 1 and r[0][1].startswith("`") for r in kernel_rows)
    assert "generated kernels" in mlp_section
    convnet_section = text.split("## convnet")[1]
    assert "RuntimeError: boom in the compiler" in rows_of(convnet_section, "ember")[0][-1]


def test_layouts_are_checked_and_each_gets_an_ember_column(profiler):
    with pytest.raises(SystemExit):
        profiler.parse_args(["mlp", "--layout", "auto,sideways"])
    args = profiler.parse_args(["mlp", "--layout", "auto,channels_last"])
    assert args.torch_compile     # on unless --no-torch-compile
    assert [profiler.ember_label(layout, dynamic, args)
            for layout, dynamic in profiler.ember_variants(args)] == [
        "ember (auto)", "ember (channels_last)"]
    args = profiler.parse_args(["mlp", "--dynamic"])
    assert [profiler.ember_label(layout, dynamic, args)
            for layout, dynamic in profiler.ember_variants(args)] == ["ember", "ember dynamic"]
