"""``eager_choice`` (ember/backend/runtime/eager_choice.py): a compiled inference graph runs
its compiled program or the captured graph eagerly, whichever its first call timed faster.

The timing is forced (``eager_choice.measure`` replaced), so no test depends on a clock: each
checks which path runs, that results are eager's, what is stored on disk and read back, and
which graphs are never timed. ``tests/conftest.py`` turns the choice off for every other
test; these turn it on per compile (``eager_choice="timed"``)."""
from __future__ import annotations

import copy
import json
import logging

import pytest
import torch
import torch.nn.functional as F

import ember
from ember import config
from ember.backend.compile import compile_graph
from ember.backend.runtime import disk_cache, eager_choice
from ember.backend.runtime.eager_choice import EagerChoice

TIMED = {"eager_choice": "timed"}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory (choices are stored there) and this process's view of caches
    forgotten."""
    root = tmp_path / "cache"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(root))
    monkeypatch.setattr(disk_cache, "_unusable", {})
    monkeypatch.setattr(disk_cache, "_checked", set())
    monkeypatch.setattr(disk_cache, "_damaged_warned", False)
    ember.reset()
    yield root
    ember.reset()


@pytest.fixture
def timings(monkeypatch):
    """``timings(compiled_s, eager_s)`` makes every timing answer those seconds;
    ``timings.calls`` lists the arguments of each timing."""
    calls = []

    def force(compiled_s: float, eager_s: float) -> None:
        def measure(compiled, eager, args, synchronize):
            calls.append(args)
            return compiled_s, eager_s
        monkeypatch.setattr(eager_choice, "measure", measure)
    force.calls = calls
    force(1.0, 1.0)
    return force


@pytest.fixture
def untimed(monkeypatch):
    """A timing fails the test: the choice must come from elsewhere (disk, a decline)."""
    def measure(*args):
        raise AssertionError("timed")
    monkeypatch.setattr(eager_choice, "measure", measure)


def _norm(x, w):       # a tuple, as the frontends' graphs return
    return (F.layer_norm(x, (32,), w) * 2 + 1,)


def _counted(choice: EagerChoice) -> dict:
    """Calls of each path of ``choice`` from now on."""
    counts = {"compiled": 0, "eager": 0}

    def counting(way, run):
        def call(*args):
            counts[way] += 1
            return run(*args)
        return call
    choice.compiled = counting("compiled", choice.compiled)
    choice.eager = counting("eager", choice.eager)
    return counts


def _perf_hints(log) -> list[str]:
    """The distinct perf hints (ember_log's caplog sees each record through two handlers)."""
    return list(dict.fromkeys(r.getMessage() for r in log.records
                              if r.name == "ember.perf_hints"))


@pytest.mark.parametrize("compiled_s, eager_s, way", [
    (2e-3, 1e-3, "eager"), (1e-3, 2e-3, "compiled"),
    (1.00e-3, 0.97e-3, "compiled"),       # eager faster by less than the margin
])
def test_the_faster_path_runs_and_results_are_eagers(cache, timings, cpu_backend, compiled_s,
                                                     eager_s, way):
    timings(compiled_s, eager_s)
    gm = torch.fx.symbolic_trace(_norm)
    x, w = torch.randn(8, 32), torch.randn(32)
    with torch.no_grad():
        choice = compile_graph(gm, [x, w], cpu_backend=cpu_backend, **TIMED)
        assert isinstance(choice, EagerChoice)
        counts = _counted(choice)
        first = choice(x, w)
        # the first call: the compiled program once (is a second run observable?), the
        # chosen path once for the result
        assert counts == {"compiled": 1 + (way == "compiled"), "eager": way == "eager"}
        second = choice(x, w)
    assert counts == {"compiled": 1 + 2 * (way == "compiled"), "eager": 2 * (way == "eager")}
    assert len(timings.calls) == 1
    expected, = _norm(x, w)
    for got in (first, second):
        assert type(got) is tuple and len(got) == 1
        torch.testing.assert_close(got[0], expected)
        if way == "eager":
            assert torch.equal(got[0], expected)


def test_inference_mode(cache, timings):
    """Inference tensors have no version counter: the first run's check skips them."""
    timings(2e-3, 1e-3)
    with torch.inference_mode():
        x, w = torch.randn(8, 32), torch.randn(32)
        got, = ember.compile(_norm, options=TIMED)(x, w)
    assert torch.equal(got, _norm(x, w)[0])
    assert len(timings.calls) == 1


def test_choice_is_logged_stored_and_read_back_after_reset(cache, timings, ember_log,
                                                           monkeypatch):
    ember.logs.set_logs("perf_hints")
    timings(3e-3, 1e-3)
    x, w = torch.randn(8, 32), torch.randn(32)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(_norm, options=TIMED)(x, w), _norm(x, w))
    line, = [m for m in _perf_hints(ember_log) if "eager choice" in m]
    assert "Graph__norm" in line and "8x32 float32, 32 float32" in line
    assert "compiled 3.000 ms, eager 1.000 ms: runs eager" in line
    entry, = (cache / "eager_choice").iterdir()
    assert json.loads(entry.read_text()) == {"way": "eager", "compiled_s": 3e-3,
                                             "eager_s": 1e-3}
    ember.reset()
    ember_log.clear()
    monkeypatch.setattr(eager_choice, "measure", lambda *a: pytest.fail("timed again"))
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(_norm, options=TIMED)(x, w), _norm(x, w))
    line, = [m for m in _perf_hints(ember_log) if "eager choice" in m]
    assert line.endswith("runs eager (from disk)")


@pytest.mark.parametrize("damage", ["{not json", '{"way": "fast", "compiled_s": 1, '
                                                  '"eager_s": 2}', '["eager"]'])
def test_damaged_entry_warns_once_and_times_again(cache, timings, ember_log, damage):
    x, w = torch.randn(8, 32), torch.randn(32)
    with torch.no_grad():
        ember.compile(_norm, options=TIMED)(x, w)
        entry, = (cache / "eager_choice").iterdir()
        entry.write_text(damage)
        ember.reset()
        torch.testing.assert_close(ember.compile(_norm, options=TIMED)(x, w), _norm(x, w))
    warnings = {r.getMessage() for r in ember_log.records if r.levelno >= logging.WARNING}
    assert len(warnings) == 1 and "damaged cache entry" in warnings.pop()
    assert len(timings.calls) == 2
    assert json.loads(entry.read_text())["way"] == "compiled"


def _not_timed_line(log) -> str:
    line, = [m for m in _perf_hints(log) if "eager choice" in m]
    assert "not timed" in line and "runs compiled" in line
    return line


def test_graph_writing_an_input_is_not_timed(cache, untimed, ember_log):
    ember.logs.set_logs("perf_hints")

    def fn(x):
        x.mul_(2)
        return x.sin() + 1
    x = torch.randn(16)
    expected_x = x.clone()
    expected = fn(expected_x)
    with torch.no_grad():
        got = ember.compile(fn, options=TIMED)(x)
    assert torch.equal(x, expected_x)      # written once
    torch.testing.assert_close(got, expected)
    assert "writes its inputs" in _not_timed_line(ember_log)


@pytest.mark.parametrize("draw", [
    lambda x: x.sin() + torch.rand_like(x),                  # seen in the graph
    lambda x: F.dropout(x.sin(), 0.5, training=True),        # seen in the first run
], ids=["rand_like", "dropout"])
def test_graph_drawing_random_numbers_is_not_timed(cache, untimed, ember_log, draw):
    ember.logs.set_logs("perf_hints")
    x = torch.randn(64)
    torch.manual_seed(0)
    expected = draw(x)
    after = torch.rand(4)
    torch.manual_seed(0)
    with torch.no_grad():
        got = ember.compile(draw, options=TIMED)(x)
    torch.testing.assert_close(got, expected)
    assert torch.equal(torch.rand(4), after)    # the generator advanced as eager's does
    line = _not_timed_line(ember_log)
    assert "rand_like (rand_like) has effects or draws random numbers" in line or \
        "its run drew random numbers" in line


@pytest.mark.parametrize("compiled_s, eager_s, way", [(2e-3, 1e-3, "eager"),
                                                     (1e-3, 2e-3, "compiled")])
def test_training_graph_is_timed_as_training_steps(cache, timings, ember_log, compiled_s,
                                                   eager_s, way):
    """A training graph is timed forward and backward, on detached copies of the inputs that
    require grad; the way chosen records the call's autograd graph: eager's own nodes, or
    the compiled halves' Function. Gradients as eager's either way."""
    ember.logs.set_logs("perf_hints")
    timings(compiled_s, eager_s)
    x = torch.randn(8, 32)
    w = torch.randn(32, requires_grad=True)
    ref = w.detach().clone().requires_grad_()
    compiled = ember.compile(_norm, options=TIMED)
    for _ in range(2):
        got, = compiled(x, w)
        expected, = _norm(x, ref)
        node = type(got.grad_fn).__name__
        assert (node == "CompiledFunctionBackward") == (way == "compiled")
        grad = torch.randn(8, 32)
        got.backward(grad)
        expected.backward(grad)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(w.grad, ref.grad)
    timed_args, = timings.calls
    assert timed_args[0] is x                          # needs no gradient: as given
    assert timed_args[1] is not w and timed_args[1].is_leaf and timed_args[1].requires_grad
    assert timed_args[1].data_ptr() == w.data_ptr()    # a new leaf on the same storage
    line, = [m for m in _perf_hints(ember_log) if "eager choice" in m]
    assert f"(forward and backward): runs {way}" in line


def test_training_step_timing_leaves_gradients_and_hooks_alone(cache):
    """The real timing runs backward steps: nothing of the user's sees them (no ``.grad``
    written, no hook run, no graph upstream of the inputs walked)."""
    x = torch.randn(8, 32)
    w = torch.randn(32, requires_grad=True)
    hooked = []
    w.register_hook(lambda g: hooked.append("w"))
    upstream = torch.randn(8, 32, requires_grad=True)
    h = upstream * 3                                   # a non-leaf input
    h.register_hook(lambda g: hooked.append("h"))
    got, = ember.compile(_norm, options=TIMED)(h, w)
    assert w.grad is None and upstream.grad is None and hooked == []
    got.sum().backward()
    assert sorted(hooked) == ["h", "w"]
    ref_w = w.detach().clone().requires_grad_()
    ref_up = upstream.detach().clone().requires_grad_()
    expected, = _norm(ref_up * 3, ref_w)
    expected.sum().backward()
    torch.testing.assert_close(w.grad, ref_w.grad)
    torch.testing.assert_close(upstream.grad, ref_up.grad)
    assert len(list((cache / "eager_choice").iterdir())) == 1


def test_training_graph_chosen_on_the_first_call_that_trains(cache, timings):
    """Calls without gradients, or with other inputs requiring grad, run compiled before it
    and do not decide."""
    x = torch.randn(8, 32)
    w = torch.randn(32, requires_grad=True)
    choice = compile_graph(torch.fx.symbolic_trace(_norm), [x, w], **TIMED)
    assert isinstance(choice, EagerChoice)
    with torch.no_grad():
        got, = choice(x, w)
    torch.testing.assert_close(got, _norm(x, w)[0].detach())
    got, = choice(x, w.detach())
    torch.testing.assert_close(got, _norm(x, w)[0].detach())
    assert timings.calls == [] and choice.run is None
    got, = choice(x, w)
    assert got.requires_grad and len(timings.calls) == 1 and choice.run is not None


def test_symbolic_training_graph_chooses_per_size(cache, timings):
    w = torch.randn(32, requires_grad=True)
    compiled = ember.compile(_norm, dynamic=True, options=TIMED)
    for n in (8, 12, 8):
        x = torch.randn(n, 32)
        got, = compiled(x, w)
        got.sum().backward()
        grad, w.grad = w.grad, None
        expected, = _norm(x, w)
        expected.sum().backward()
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(grad, w.grad)
        w.grad = None
    assert [tuple(a.shape) for call in timings.calls for a in call
            if isinstance(a, torch.Tensor) and not a.requires_grad] == [(8, 32), (12, 32)]


def test_training_graph_writing_an_input_is_not_timed(cache, untimed, ember_log):
    """Batch norm's running statistics are inputs the forward half writes."""
    ember.logs.set_logs("perf_hints")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    ref = copy.deepcopy(model)
    x = torch.randn(2, 3, 8, 8)
    got = ember.compile(model, options=TIMED)(x)
    expected = ref(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(model[1].running_mean, ref[1].running_mean)   # written once
    assert "writes its inputs" in _not_timed_line(ember_log)


def test_out_of_memory_while_timing_keeps_compiled(cache, ember_log, monkeypatch):
    ember.logs.set_logs("perf_hints")

    def measure(*args):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
    monkeypatch.setattr(eager_choice, "measure", measure)
    x = torch.randn(8, 32)
    w = torch.randn(32, requires_grad=True)
    got, = ember.compile(_norm, options=TIMED)(x, w)
    assert type(got.grad_fn).__name__ == "CompiledFunctionBackward"
    torch.testing.assert_close(got, _norm(x, w)[0])
    line = _not_timed_line(ember_log)
    assert "out of memory while timing" in line
    assert not (cache / "eager_choice").exists() or not any((cache / "eager_choice").iterdir())


def test_training_graph_of_library_calls_runs_as_captured(cache, untimed, ember_log):
    """A training graph whose compiled halves generate no kernel (causal attention: ATen's
    attention forward and backward) runs as captured, under eager's autograd nodes, not a
    Python autograd Function around the same calls: eager's gradients, bit for bit. With
    the choice off it runs compiled."""
    ember.logs.set_logs("perf_hints")

    def attend(q, k, v):
        return (F.scaled_dot_product_attention(q, k, v, is_causal=True),)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 8) for _ in range(3))
    grad = torch.randn(2, 2, 16, 8)
    expected_out, = attend(*(t.clone().requires_grad_() for t in (q, k, v)))
    for options, node in ((TIMED, type(expected_out.grad_fn).__name__),
                          ({"eager_choice": "off"}, "CompiledFunctionBackward")):
        ember.reset()
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = [t.clone().requires_grad_() for t in (q, k, v)]
        out, = ember.compile(attend, options=options)(*leaves)
        expected, = attend(*ref)
        assert type(out.grad_fn).__name__ == node
        out.backward(grad)
        expected.backward(grad)
        assert torch.equal(out, expected)
        for a, b in zip(leaves, ref):
            assert torch.equal(a.grad, b.grad)
    line, = [m for m in _perf_hints(ember_log) if "eager choice" in m]
    assert "runs as captured, under eager's autograd" in line and "not timed" in line


def test_graph_of_library_calls_runs_eagerly_untimed(cache, untimed, ember_log):
    ember.logs.set_logs("perf_hints")

    def mm(a, b):
        return ((a @ b) @ b,)
    gm = torch.fx.symbolic_trace(mm)
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    with torch.no_grad():
        run = compile_graph(gm, [a, b], **TIMED)
        got, = run(a, b)
        assert torch.equal(got, mm(a, b)[0])
    line, = [m for m in _perf_hints(ember_log) if "eager choice" in m]
    assert "only library calls" in line and "not timed" in line


def test_symbolic_program_chooses_per_size(cache, timings, cpu_backend):
    def fn(x):
        return torch.relu(x) * 2 + x.cos()
    xs = [torch.randn(8, 4), torch.randn(12, 4), torch.randn(8, 4), torch.randn(12, 4)]
    with torch.no_grad():
        compiled = ember.compile(fn, dynamic=True, options=TIMED)
        for x in xs:
            torch.testing.assert_close(compiled(x), fn(x))
    assert [tuple(a.shape) for call in timings.calls for a in call
            if isinstance(a, torch.Tensor)] == [(8, 4), (12, 4)]


def test_off_and_auto(cache, untimed, ember_log, monkeypatch):
    gm = torch.fx.symbolic_trace(_norm)
    inputs = [torch.randn(8, 32), torch.randn(32)]
    ember.logs.set_logs("perf_hints")
    with torch.no_grad():
        assert not isinstance(compile_graph(gm, inputs, eager_choice="off"), EagerChoice)
        # auto follows config.eager_choice (tests/conftest.py: off) ...
        assert not isinstance(compile_graph(gm, inputs), EagerChoice)
        with config.patch(eager_choice="timed"):
            assert isinstance(compile_graph(gm, inputs), EagerChoice)
            # ... except under Triton's interpreter, whose timings mean nothing
            assert not isinstance(compile_graph(gm, inputs, cpu_backend="triton"),
                                  EagerChoice)
    assert any("not run natively" in m for m in _perf_hints(ember_log))
    with pytest.raises(ValueError, match="'eager_choice' is 'on': expected one of 'timed', "
                                         "'off'"):
        config.eager_choice = "on"


def test_first_run_that_writes_an_input_is_the_result(cache, untimed):
    """Found by the first run itself (the program did not say it writes its inputs): that
    run's result is the call's, and the program is kept."""
    runs = []

    def compiled(x):
        runs.append("compiled")
        x.add_(1)
        return (x * 2,)

    def eager(x):
        runs.append("eager")
        return (x * 2,)
    from ember.backend.targets import target_for
    choice = EagerChoice(compiled, eager, "g", "key", target_for(torch.device("cpu")))
    x = torch.zeros(3)
    assert torch.equal(choice(x)[0], torch.full((3,), 2.0))
    assert torch.equal(choice(x)[0], torch.full((3,), 4.0))
    assert runs == ["compiled", "compiled"]


def test_measure_runs_each_path_a_bounded_number_of_times():
    runs = {"compiled": 0, "eager": 0, "synchronize": 0}

    def counter(name):
        def run(*args):
            runs[name] += 1
        return run
    compiled_s, eager_s = eager_choice.measure(counter("compiled"), counter("eager"), [],
                                               counter("synchronize"))
    assert 0 <= compiled_s < float("inf") and 0 <= eager_s < float("inf")
    assert 2 <= runs["compiled"] <= eager_choice.MAX_ROUNDS + 1   # and a warm-up run
    assert runs["eager"] == runs["compiled"]
    assert runs["synchronize"] == 2 * (runs["compiled"] + runs["eager"])


def test_measure_stops_after_two_long_compiled_runs(monkeypatch):
    monkeypatch.setattr(eager_choice, "LONG_RUN_S", 0.0)
    runs = {"compiled": 0, "eager": 0}

    def counter(name):
        def run(*args):
            runs[name] += 1
        return run
    with pytest.raises(eager_choice.LongRun):
        eager_choice.measure(counter("compiled"), counter("eager"), [], lambda: None)
    assert runs == {"compiled": 2, "eager": 0}


def test_long_training_step_is_not_timed_and_runs_compiled(cache, ember_log, monkeypatch):
    """A graph whose warm compiled runs take over LONG_RUN_S (here 0) is not timed further:
    the first call would grow by seconds for a large model. Nothing is stored."""
    ember.logs.set_logs("perf_hints")
    monkeypatch.setattr(eager_choice, "LONG_RUN_S", 0.0)
    x = torch.randn(8, 32)
    w = torch.randn(32, requires_grad=True)
    got, = ember.compile(_norm, options=TIMED)(x, w)
    assert type(got.grad_fn).__name__ == "CompiledFunctionBackward"
    torch.testing.assert_close(got, _norm(x, w)[0])
    got.sum().backward()
    assert w.grad is not None
    assert "a compiled run takes" in _not_timed_line(ember_log)
    assert not (cache / "eager_choice").exists() or not any((cache / "eager_choice").iterdir())


class _AsTuple(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return (self.module(x),)


def test_frozen_graph_of_library_calls_is_timed(cache, timings):
    """Freezing may fold work away: a program of library calls is timed, not sent to eager."""
    timings(2e-3, 1e-3)
    model = torch.nn.Linear(16, 8, bias=False).eval()
    gm = torch.fx.symbolic_trace(_AsTuple(model))
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert not isinstance(compile_graph(gm, [x], **TIMED), EagerChoice)    # not frozen
        choice = compile_graph(gm, [x], freezing=True, **TIMED)
        assert isinstance(choice, EagerChoice)
        assert torch.equal(choice(x)[0], model(x))
    assert len(timings.calls) == 1
