"""``ember bench``'s suites, compilers, dtype, batch size and kernel rows, on tiny CPU sizes.

Speed is never asserted (DESIGN.md §7): only that the options reach the rows, the numbers are
consistent with each other (GB/s from bytes and times) and failures become "n/a" with a note.
torch.compile is left out (``--no-torch-compile`` or ember-only ``compilers``): importing
inductor alone takes ~10 s here.
"""
import json
import re

import pytest
import torch

from ember.bench import cli, harness, kernels, report, zoo

TINY = ["--iters", "2", "--warmup", "1", "--no-isolate"]


def cells(line: str) -> list[str]:
    """A table line's cells (columns are separated by two spaces or more)."""
    return re.split(r"\s{2,}", line.strip())


# ------------------------------------------------------------------------ argument parsing

def test_resolve_compilers_orders_names_and_always_measures_eager():
    assert harness.resolve_compilers() == ("eager", "ember", "torch-inductor")
    assert harness.resolve_compilers("torch-inductor-reduce-overhead, ember") == (
        "eager", "ember", "torch-inductor-reduce-overhead")
    assert harness.resolve_compilers("all") == harness.VARIANTS
    assert harness.resolve_compilers("all", with_torch_compile=False) == (
        "eager", "ember", "ember-reduce-overhead", "ember-max-autotune")
    assert harness.resolve_compilers(["eager"]) == ("eager",)
    assert harness.resolve_compilers("mod:fn,ember") == ("eager", "ember", "mod:fn")
    with pytest.raises(ValueError, match="unknown compiler.*inductor.*known: eager"):
        harness.resolve_compilers("ember,inductor")


@pytest.mark.parametrize("argv, message", [
    (["--compilers", "ember,tvm"], "--compilers: unknown compiler(s): tvm"),
    (["--suite", "huge"], "--suite: unknown suite(s) huge; known: builtin, timm, hf"),
    (["--models", "mlp,nope"], "known kernels: pointwise, softmax, layer_norm"),
    (["--models", "mlp", "--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
    (["--models", "mlp", "--batch-size", "0"], "--batch-size must be >= 1"),
    (["--suite", "kernels", "--kernel-bytes", "lots"], "expected a byte count"),
    (["--suite", "kernels", "--kernel-bytes", "2"], "--kernel-bytes must be >= 4"),
    (["--models", "mlp", "--mode", "fly"], "argument --mode: invalid choice: 'fly'"),
    (["--suite", "kernels", "--mode", "train"], "--mode train: kernel rows are inference"),
    (["--models", "mlp", "--repeat", "0"], "--repeat must be >= 1"),
    (["--models", "mlp", "--timeout", "0"], "--timeout must be > 0 seconds"),
    (["--models", "mlp", "--budget", "-1"], "--budget must be > 0 seconds"),
    (["--models", "mlp", "--no-isolate", "--no-warm-compile"],
     "--no-warm-compile: --no-isolate already measures no warm compile"),
    (["--models", "no_such_module_xyz:make"], "no module named 'no_such_module_xyz'"),
    (["--models", "missing/file.py:make"], "no file 'missing/file.py'"),
    (["--models", "mlp", "--compilers", "ember,no_such_module_xyz:jit"],
     "--compilers: 'no_such_module_xyz:jit': no module named 'no_such_module_xyz'"),
    (["--models", "mlp", "--no-isolate", "--timeout", "5"],
     "--timeout: --no-isolate runs every row in this process, without a timeout"),
    (["--compare", "a.json", "b.json", "--suite", "timm"],
     "--compare prints a comparison of two saved runs and takes no other option (got "
     "--suite)"),
    (["--compare", "no_a.json", "no_b.json"], "--compare: [Errno 2]"),
])
def test_bad_options_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_suites_and_models_select_rows_in_order():
    parser = cli.build_parser()

    def rows(*argv):
        return [(kind, name) for kind, name, _ in
                cli.select_rows(parser, parser.parse_args(list(argv)))]

    builtin = [("model", name) for name in zoo.in_suite("builtin")]
    assert rows() == builtin                                   # the default
    assert rows("--models", "convnet") == [("model", "convnet")]
    assert rows("--suite", "kernels") == [("kernel", "pointwise"), ("kernel", "softmax"),
                                          ("kernel", "layer_norm")]
    assert rows("--suite", "kernels", "--models", "mlp,softmax") == [
        ("kernel", "pointwise"), ("kernel", "softmax"), ("kernel", "layer_norm"),
        ("model", "mlp")]
    assert rows("--models", "bench_fakes:tiny") == [("model", "bench_fakes:tiny")]
    if all(zoo.is_available(n) for n in zoo.in_suite("gpu")):
        assert rows("--suite", "gpu") == [("model", n) for n in
                                          ("resnet50", "mobilenetv3_large_100", "vit_base",
                                           "bert_base", "gpt2")]
    everything = rows("--suite", "all")
    assert everything[:len(builtin)] == builtin
    assert len(everything) == sum(len(zoo.in_suite(s)) for s in cli.ALL_SUITES
                                  if cli.missing_suite_package(s) is None)


def test_a_suite_whose_package_is_missing_is_skipped_with_a_message(monkeypatch, capsys):
    monkeypatch.setitem(cli.SUITE_PACKAGES, "timm", "no_such_package_xyz")
    parser = cli.build_parser()
    rows = cli.select_rows(parser, parser.parse_args(["--suite", "builtin,timm"]))
    assert [name for _, name, _ in rows] == zoo.in_suite("builtin")
    assert ("skipping suite 'timm': the 'no_such_package_xyz' package is not installed"
            in capsys.readouterr().err)
    with pytest.raises(SystemExit) as exit_info:
        cli.select_rows(parser, parser.parse_args(["--suite", "timm"]))
    assert exit_info.value.code == 2
    assert "nothing to measure" in capsys.readouterr().err


def test_kernel_bytes_accepts_powers_of_two():
    assert cli._byte_count("2^28") == 2 ** 28
    assert cli._byte_count("2**12") == 4096
    assert cli._byte_count("65536") == 65536


# -------------------------------------------------------------------- models: dtype, batch

def test_gpu_suite_models_are_bfloat16_with_the_issue_batch_sizes():
    expected = {"resnet50": 64, "mobilenetv3_large_100": 64, "vit_base": 32, "bert_base": 16,
                "gpt2": 16}
    assert zoo.in_suite("gpu") == list(expected)
    assert zoo.in_suite("gpu", "infer") == list(expected)
    for name, batch in expected.items():
        spec = zoo.MODELS[name]
        assert spec.dtype == torch.bfloat16
        assert spec.default_batch_size("cuda") == batch
        assert spec.default_batch_size("cpu") == 1
        assert spec.default_batch_size("cpu", "train") == 1
    assert not set(expected) & set(zoo.in_suite("builtin"))


def test_gpu_suite_in_train_mode_is_the_training_benchmark():
    # issue 10: AMP training of resnet50 (64), vit_base (32), BERT-base (16 x 512) and
    # GPT-2 (8 x 512) on the H200.
    args = cli.build_parser().parse_args(["--device", "cuda", "--mode", "train", "--suite", "gpu",
                                          "--dtype", "bfloat16"])
    if not all(zoo.is_available(n) for n in zoo.in_suite("gpu")):
        pytest.skip("timm or transformers is not installed")
    rows = cli.select_rows(cli.build_parser(), args)
    assert [name for _, name, _ in rows] == ["resnet50", "vit_base", "bert_base", "gpt2"]
    batches = {name: zoo.MODELS[name].default_batch_size("cuda", "train")
               for _, name, _ in rows}
    assert batches == {"resnet50": 64, "vit_base": 32, "bert_base": 16, "gpt2": 8}
    # the sizes as built (on the meta device: nothing is allocated)
    _, (ids,) = zoo.build_model("gpt2", "meta", batch_size=batches["gpt2"], mode="train")
    assert tuple(ids.shape) == (8, 128)   # 512 tokens on CUDA; the meta device gets the CPU's
    assert zoo.MODELS["gpt2"].default_batch_size("cuda") == 16     # inference unchanged


def test_memory_is_reported_against_eagers_on_cuda():
    row = harness.Row("m", "cuda", "ember", eager_ms=2.0, ember_ms=1.0, mode="train")
    row.variants = {"eager": harness.Variant(ms=2.0, peak_mem_mb=400.0),
                    "ember": harness.Variant(ms=1.0, peak_mem_mb=300.0, correct=True),
                    "torch-inductor": harness.Variant(ms=1.5, peak_mem_mb=500.0, correct=True)}
    assert row.memory_vs_eager("ember") == pytest.approx(0.75)
    assert row.as_dict()["variants"]["torch-inductor"]["peak_mem_vs_eager"] == 1.25
    compilers = ("eager", "ember", "torch-inductor")
    lines = report.format_report([row], compilers, "cuda").splitlines()
    header = cells(next(line for line in lines if line.startswith("model ")))
    line = dict(zip(header, cells(next(line for line in lines if line.startswith("m ")))))
    assert (line["eager MB"], line["ember mem"], line["torch.compile mem"]) == (
        "400", "0.75x", "1.25x")
    assert report.summary([row], compilers)["ember"]["geomean_mem_vs_eager"] == 0.75
    cpu_header = report.format_model_table([row], compilers, "cpu").splitlines()[0]
    assert "ember mem" not in cpu_header and "torch.compile cold s" in cpu_header


def test_dtype_casts_weights_buffers_and_float_inputs():
    model, (x,) = zoo.build_model("convnet", dtype=torch.bfloat16, batch_size=2)
    assert x.dtype == torch.bfloat16 and x.shape == (2, 3, 64, 64)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    bn = model.features[0][1]
    assert bn.running_mean.dtype == torch.bfloat16
    assert bn.num_batches_tracked.dtype == torch.int64      # integer buffers stay integer
    reference, (x32,) = zoo.build_model("convnet", batch_size=2)
    assert torch.equal(x, x32.to(torch.bfloat16))            # same seeded values, rounded
    with torch.no_grad():
        assert model(x).dtype == torch.bfloat16


def test_token_ids_stay_integer_under_a_float_dtype():
    if not zoo.is_available("bert"):
        pytest.skip("transformers is not installed")
    model, (ids,) = zoo.build_model("bert", dtype=torch.float16, batch_size=3)
    assert ids.dtype == torch.int64 and ids.shape == (3, 64)
    assert {p.dtype for p in model.parameters()} == {torch.float16}


def test_harness_row_reports_dtype_batch_and_inputs():
    row = harness.benchmark_model("mlp", iters=1, warmup=0, compilers="ember",
                                  dtype=torch.float64, batch_size=5)
    assert (row.dtype, row.batch_size, row.inputs) == ("float64", 5, ["5x512 float64"])
    assert row.ember_ms > 0 and row.max_abs_err is not None and row.max_abs_err < 1e-9
    assert set(row.variants) == {"eager", "ember"}
    assert row.variants["ember"].host_ms > 0 and row.variants["ember"].first_call_s > 0


# ------------------------------------------------------------------------------ kernel rows

def test_kernel_bytes_moved_count_inputs_and_output():
    case = kernels.build_kernel("pointwise", "cpu", torch.float32, tensor_bytes=4096)
    assert [t.shape for t in case.inputs] == [(1024,)] * 3
    assert case.bytes_moved == 4 * 4096 and case.copy_numel == 2 * 1024
    case = kernels.build_kernel("layer_norm", "cpu", torch.bfloat16, tensor_bytes=2 ** 12)
    assert case.inputs[0].shape == (2, 1024) and case.inputs[1].shape == (1024,)
    assert case.bytes_moved == 2 * 2 ** 12 + 2 * 2 * 1024
    case = kernels.build_kernel("softmax", "cpu", torch.float32, tensor_bytes=400)
    assert case.inputs[0].shape == (1, 100)                 # too small for a full row
    with pytest.raises(ValueError, match="unknown kernel"):
        kernels.build_kernel("matmul")


def test_kernel_row_reports_gbps_against_copy():
    row = harness.benchmark_kernel("softmax", iters=3, warmup=1, compilers="ember",
                                   tensor_bytes=2 ** 14)
    assert row.kind == "kernel" and row.bytes_moved == 2 * 2 ** 14
    assert row.inputs == ["4x1024 float32"]
    assert row.copy_ms > 0 and row.eager_ms > 0 and row.ember_ms > 0
    assert row.max_abs_err < 1e-5
    assert row.copy_gbps == pytest.approx(row.bytes_moved / (row.copy_ms * 1e6))
    for variant in ("eager", "ember"):
        assert row.gbps(variant) == pytest.approx(row.bytes_moved / (row.ms(variant) * 1e6))
        assert row.fraction_of_copy(variant) == pytest.approx(
            row.gbps(variant) / row.copy_gbps)
    data = row.as_dict()
    assert data["copy_gbps"] == pytest.approx(row.copy_gbps)
    assert data["variants"]["ember"]["gbps"] == pytest.approx(row.gbps("ember"))
    assert data["variants"]["ember"]["fraction_of_copy"] == pytest.approx(
        row.fraction_of_copy("ember"))


def test_cli_kernels_suite_prints_a_gbps_table_and_json(capsys, tmp_path):
    out_json = tmp_path / "kernels.json"
    assert cli.main(["bench", "--suite", "kernels", "--models", "mlp", *TINY,
                     "--compilers", "ember,ember-reduce-overhead", "--kernel-bytes", "2^12",
                     "--dtype", "bfloat16", "--json", str(out_json)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("kernel "))
    assert cells(header) == ["kernel", "MB moved", "copy GB/s", "eager GB/s", "ember GB/s",
                             "ember-ro GB/s", "ember err"]
    for name in kernels.known():
        (line,) = [line for line in lines if line.split()[:1] == [name]]
        row = cells(line)
        assert float(row[2]) > 0                                        # copy GB/s
        for cell in row[3:6]:                                           # eager, ember, ro
            assert re.fullmatch(r"[\d.]+ \(\d+%\)", cell), cell
    model_header = cells(next(line for line in lines if line.startswith("model ")))
    assert "ember-ro" in model_header and "torch.compile" not in model_header

    report = json.loads(out_json.read_text())
    assert report["compilers"] == ["eager", "ember", "ember-reduce-overhead"]
    assert report["dtype"] == "bfloat16" and report["kernel_bytes"] == 4096
    assert report["suites"] == ["kernels"] and report["timer"] == "time.perf_counter"
    assert [(r["kind"], r["model"]) for r in report["rows"]] == [
        ("kernel", "pointwise"), ("kernel", "softmax"), ("kernel", "layer_norm"),
        ("model", "mlp")]
    for row in report["rows"]:
        assert row["dtype"] == "bfloat16"
        assert set(row["variants"]) == {"eager", "ember", "ember-reduce-overhead"}
        if row["kind"] == "kernel":
            assert row["copy_gbps"] > 0 and row["variants"]["ember"]["gbps"] > 0
            assert row["variants"]["eager"]["fraction_of_copy"] > 0
        else:
            assert row["batch_size"] == 64 and "copy_gbps" not in row


# ---------------------------------------------------------------------- failures are n/a

def test_a_variant_that_fails_to_compile_is_na_with_a_note(monkeypatch, capsys):
    def not_implemented(fn, backend):
        raise NotImplementedError("reduce-overhead needs CUDA graphs")

    monkeypatch.setitem(harness.COMPILERS, "ember-reduce-overhead", not_implemented)
    assert cli.main(["bench", "--models", "mlp", *TINY, "--compilers",
                     "ember,ember-reduce-overhead"]) == cli.EXIT_FAILED
    captured = capsys.readouterr()
    assert ("ember bench: 1 of 1 rows failed or were wrong: mlp (ember-reduce-overhead "
            "failed)") in captured.err
    lines = captured.out.splitlines()
    header = cells(next(line for line in lines if line.startswith("model ")))
    (mlp,) = [cells(line) for line in lines if line.split()[:1] == ["mlp"]]
    row = dict(zip(header, mlp))
    assert row["ember-ro"] == "failed"
    assert row["ember"].endswith("x")
    assert ("note: mlp: ember-reduce-overhead failed: NotImplementedError: reduce-overhead "
            "needs CUDA graphs") in lines


def test_a_variant_that_fails_while_timed_is_dropped(monkeypatch):
    calls = []

    def flaky(fn, backend):
        def run(*args):
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("replay failed")
            return fn(*args)
        return run

    monkeypatch.setitem(harness.COMPILERS, "ember-reduce-overhead", flaky)
    row = harness.benchmark_kernel("pointwise", iters=2, warmup=1, tensor_bytes=1024,
                                   compilers="ember-reduce-overhead")
    ro = row.variants["ember-reduce-overhead"]
    assert ro.first_call_s is not None and ro.max_abs_err == 0.0    # the first call ran
    assert ro.ms is None and ro.error == "failed while timing: RuntimeError: replay failed"
    assert row.gbps("ember-reduce-overhead") is None
    assert row.eager_ms > 0 and row.copy_ms > 0                      # the others go on
    assert "ember-reduce-overhead failed while timing: RuntimeError: replay failed" in \
        row.notes


def test_a_row_that_cannot_be_built_is_reported(monkeypatch, capsys):
    def broken(device, batch_size):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setitem(zoo.MODELS, "mlp",
                        zoo.ModelSpec("mlp", broken, batch_size=64))
    assert cli.main(["bench", "--models", "mlp,softmax", *TINY, "--compilers", "ember",
                     "--kernel-bytes", "1024"]) == cli.EXIT_FAILED
    captured = capsys.readouterr()
    assert "ember bench: 1 of 2 rows failed or were wrong: mlp (error)" in captured.err
    out = captured.out
    assert "note: mlp: not measured: RuntimeError: CUDA out of memory" in out
    assert re.search(r"^mlp\s+n/a\s+error\s", out, re.MULTILINE)
    assert re.search(r"^softmax\s", out, re.MULTILINE)


def test_kernel_table_shows_missing_values_as_na():
    row = harness.Row("softmax", "cpu", "ember", eager_ms=None, kind="kernel")
    table = report.format_kernel_table([row], ("eager", "ember"))
    assert cells(table.splitlines()[2]) == ["softmax"] + ["n/a"] * 5


# ------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_rows_are_timed_with_events():
    row = harness.benchmark_kernel("layer_norm", "cuda", iters=3, warmup=1,
                                   compilers="ember", dtype=torch.bfloat16,
                                   tensor_bytes=2 ** 20)
    assert row.copy_ms > 0 and row.eager_ms > 0 and row.inputs[0].endswith("bfloat16")
    assert row.variants["eager"].host_ms > 0
    model_row = harness.benchmark_model("mlp", "cuda", iters=3, warmup=1, compilers="ember",
                                        dtype=torch.bfloat16)
    assert model_row.eager_ms > 0 and model_row.dtype == "bfloat16"


def test_variants_are_timed_round_robin_per_repeat_and_report_the_median(monkeypatch):
    # A slow spell of a loaded machine must hit every variant alike: calls interleave
    # (a, b, c, a, b, c, ...), warm-up rounds too, and each time is the median of its own.
    order, clock = [], [0.0]
    costs = {"a": [5, 1, 2, 3], "b": [5, 4, 6, 5], "c": [5, 9, 1, 1]}

    def call(name):
        def run():
            order.append(name)
            clock[0] += costs[name][len([n for n in order if n == name]) - 1]
        return run

    monkeypatch.setattr(harness.time, "perf_counter", lambda: clock[0])
    times = harness.time_calls({name: call(name) for name in "abc"}, torch.device("cpu"),
                               iters=3, warmup=1)
    assert order == list("abc") * 4
    assert {name: ms for name, (ms, _) in times.items()} == {"a": 2000, "b": 5000, "c": 1000}


def test_amp_keeps_float32_weights_and_autocasts_inside_the_model():
    model, (x,) = zoo.build_model("mlp", batch_size=2, amp=torch.bfloat16)
    assert isinstance(model, zoo.Autocast) and x.dtype == torch.float32
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model(x).dtype == torch.bfloat16                  # the linears ran in bfloat16
    with pytest.raises(ValueError, match="amp autocasts float32 weights"):
        zoo.build_model("mlp", amp=torch.bfloat16, dtype=torch.float16)


def test_amp_train_run_checks_results_with_the_autocast_dtypes_tolerance(capsys, tmp_path):
    assert cli.main(["bench", "--models", "mlp", "--mode", "train", "--amp", "--compilers",
                     "ember", "--batch-size", "4", *TINY, "--json",
                     str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "float32 weights, autocast bfloat16" in out
    assert "  mlp: float32, autocast bfloat16, batch 4; inputs 4x512 float32" in out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["amp"] == "bfloat16" and data["dtype"] is None
    (row,) = data["rows"]
    assert row["amp"] == "bfloat16" and row["dtype"] == "float32"
    assert row["reference_dtype"] == "float32"             # half precision: float32 reference
    assert row["variants"]["ember"]["correct"] is True, row["notes"]
    assert row["variants"]["eager"]["rel_err"] > 1e-4      # bfloat16's error, not float32's


@pytest.mark.parametrize("argv, message", [
    (["--models", "mlp", "--amp", "--dtype", "float32"], "--amp autocasts float32 weights"),
    (["--suite", "kernels", "--amp"], "--amp: kernel rows take --dtype itself"),
])
def test_amp_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", *argv, *TINY])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_cuda_graph_variants_have_no_peak_memory(monkeypatch):
    """A CUDA-graph replay allocates nothing (its memory is the graph's pool, held since
    capture): its peak is n/a, not 0.00x eager's. Others get what one call allocated."""
    allocated = {"now": 100, "peak": 100}

    def call(extra):
        def run():
            allocated["peak"] = max(allocated["peak"], allocated["now"] + extra)
        return run
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated["now"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda device=None: allocated.update(peak=allocated["now"]))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocated["peak"])
    row = harness.Row("m", "cuda", "ember", eager_ms=None, ember_ms=None)
    names = ("eager", "ember", "ember-reduce-overhead", "torch-inductor-reduce-overhead")
    row.variants = {name: harness.Variant() for name in names}
    calls = {"eager": call(4e6), "ember": call(3e6), "ember-reduce-overhead": call(0),
             "torch-inductor-reduce-overhead": call(0)}
    harness._measure_memory(row, calls, torch.device("cuda"), {})
    assert row.variants["eager"].peak_mem_mb == pytest.approx(4.0)
    assert row.memory_vs_eager("ember") == pytest.approx(0.75)
    assert row.variants["ember-reduce-overhead"].peak_mem_mb is None
    assert row.memory_vs_eager("torch-inductor-reduce-overhead") is None
