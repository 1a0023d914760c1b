"""Matmuls with their pointwise epilogue in one Triton kernel, under ``max_autotune``
(backend/targets/triton/templates.py, targets/triton/matmul.py, launch.MatmulChoice).

Each case runs on CPU tensors through Triton's interpreter (CI) and on CUDA tensors in
float32, float16 and bfloat16 (``gpu`` marker). Under the interpreter the generated kernel
is the one that runs (timings there mean nothing); the tests also run the other way, the
library's matmul then the epilogue alone, and every tile config, against eager.
"""
import gc
import json

import pytest
import torch
import torch.nn.functional as F

import ember
from ember import config, logs
from ember.backend import compile as backend_compile
from ember.backend.targets.triton.launch import MatmulChoice
from ember.testing import same

pytest.importorskip("triton")

from triton_targets import INTERPRETED, TARGETS, TOLERANCE  # noqa: E402


@pytest.fixture(autouse=True)
def _strict(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))    # choices are not reused
    ember.reset()
    with config.patch(suppress_errors=False), torch.no_grad():
        yield


def compile_autotuned(fn, device, max_autotune=True):
    backend_compile.generated_sources.clear()
    options = {"max_autotune": max_autotune}
    if device == "cpu":
        options["cpu_backend"] = "triton"
    return ember.compile(fn, backend="ember", options=options)


def sources() -> str:
    return "\n".join(backend_compile.generated_sources)


def choices(old=()) -> list[MatmulChoice]:
    """The live MatmulChoices, but those in ``old``."""
    gc.collect()
    return [o for o in gc.get_objects() if type(o) is MatmulChoice and o not in old]


def check(target, fn, *shapes, fused=1):
    """``fn`` compiled with max_autotune matches eager; ``fused`` matmuls run with their
    epilogue, and each of their ways (every tile config, the library) matches eager too.
    Each call gets fresh copies of the inputs (``fn`` may write over them)."""
    device, dtype = target
    inputs = [torch.randn(s, device=device, dtype=dtype) for s in shapes]
    fresh = lambda: [t.clone() for t in inputs]     # noqa: E731
    expected = fn(*fresh())
    old = choices()
    compiled = compile_autotuned(fn, device)
    tol = TOLERANCE[dtype]
    assert same(expected, compiled(*fresh()), rtol=tol, atol=tol)
    assert same(expected, compiled(*fresh()), rtol=tol, atol=tol)    # the chosen way again
    found = choices(old)
    assert len(found) == fused
    if not fused:
        assert "tl.dot" not in sources()
        return
    assert "tl.dot" in sources()
    choice = found[0]
    for way in choice._ways().values():       # each way, in place of the chosen one
        choice.run = way
        assert same(expected, compiled(*fresh()), rtol=tol, atol=tol), way


@pytest.mark.parametrize("target", TARGETS)
def test_linear_with_activation_and_residual(target):
    """addmm (a linear of a 3-D input: its rows split over two loops) + gelu + residual."""
    def fn(x, w, b, r):
        return F.gelu(F.linear(x, w, b)) + r
    check(target, fn, (2, 40, 48), (64, 48), (64,), (2, 40, 64))


@pytest.mark.parametrize("target", TARGETS)
def test_mm_with_scaled_addmm_and_transposed_operand(target):
    """mm of a transposed operand with relu; addmm with alpha and beta and a 2-D bias."""
    check(target, lambda a, b: torch.relu(a.t() @ b) * 3, (48, 80), (48, 72))
    ember.reset()
    check(target, lambda c, a, b: torch.sigmoid(torch.addmm(c, a, b, beta=0.5, alpha=2.0)),
          (64, 32), (64, 40), (40, 32))


@pytest.mark.parametrize("target", TARGETS[:1])
def test_graph_cache_keeps_the_fused_matmul(target, monkeypatch, ember_log):
    """A new process (here: a reset) loads the graph with its matmul kernel from the cache."""
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "1")
    logs.set_logs("output_code")
    x, w = torch.randn(32, 48), torch.randn(48, 40)

    def fn(x, w):
        return torch.tanh(x @ w)
    for attempt in range(2):
        ember.reset()
        old = choices()
        compiled = compile_autotuned(fn, target[0])
        assert same(fn(x, w), compiled(x, w), rtol=1e-4, atol=1e-4)
        assert len(choices(old)) == 1
    assert "graph cache hit" in ember_log.text


@pytest.mark.parametrize("target", TARGETS[:1])
def test_matmuls_that_stay_library_calls(target, ember_log):
    """The matmul's result is also returned; the epilogue writes over an operand in place
    (other tiles still read it: the fused kernel gave wrong values); a reduction reads the
    result; its rows are under 16; max_autotune is off: each runs the library's matmul, and
    the log says why."""
    device, dtype = target
    logs.set_logs("perf_hints")
    def returned_too(a, b):
        m = a @ b
        return m, m.relu()
    def written_over_an_operand(x, w):
        x.copy_(torch.relu(x @ w))
        return x
    cases = [(returned_too, (32, 32), (32, 32)),
             (written_over_an_operand, (64, 64), (64, 64)),
             (lambda a, b: torch.softmax(a @ b, -1), (32, 32), (32, 32)),
             (lambda a, b: (a @ b).relu(), (8, 32), (32, 32))]
    for fn, *shapes in cases:
        ember.reset()
        check(target, fn, *shapes, fused=0)
    text = ember_log.text
    assert "1 matmuls stay library calls (a dim under 16: 1)" in text
    assert "1 matmuls stay library calls (the kernel after it is not pointwise: 1)" in text
    assert "1 matmuls stay library calls (the kernel after it writes over an operand: 1)" in text
    ember.reset()
    a, b = torch.randn(32, 32), torch.randn(32, 32)
    old = choices()
    compiled = compile_autotuned(lambda a, b: (a @ b).relu(), device, max_autotune=False)
    assert same((a @ b).relu(), compiled(a, b))
    assert not choices(old) and "tl.dot" not in sources()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs a CUDA GPU")
def test_choice_is_timed_and_cached_on_disk(tmp_path):
    """On the GPU the first call times every way and keeps the winner on disk; a new
    process (here: a reset) reads it back instead of timing again."""
    x, w, b = (torch.randn(s, device="cuda", dtype=torch.bfloat16)
               for s in ((512, 256), (384, 256), (384,)))

    def fn(x, w, b):
        return F.silu(F.linear(x, w, b))
    compiled = compile_autotuned(fn, "cuda")
    assert same(fn(x, w, b), compiled(x, w, b), rtol=4e-2, atol=4e-2)
    saved = list((tmp_path / "autotune").glob("*.json"))
    assert len(saved) == 1
    way = json.loads(saved[0].read_text())["way"]
    assert way == "library" or way.startswith("triton ")
    ember.reset()
    old = choices()
    compiled = compile_autotuned(fn, "cuda")
    assert same(fn(x, w, b), compiled(x, w, b), rtol=4e-2, atol=4e-2)
    (choice,) = choices(old)
    assert choice.run == choice._ways()[way] or (way == "library" and
                                                 choice.run == choice.library)
