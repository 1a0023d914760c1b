"""Code the bytecode layer refuses to read (run-time rewrites such as ENTER_EXECUTOR or
INSTRUMENTED_* opcodes, which co_code normally hides) makes the frame run eagerly with the
reason (or, for the code of an inlined call, the call breaks the graph and runs as it is),
rather than being copied into generated code."""
import torch

import ember
from ember.frontend import bytecode, translator
from ember.testing import same


def inner(x):
    return x + 1


def outer(x):
    return inner(x) * 2


def test_unreadable_code_runs_eagerly(monkeypatch):
    real = translator.disassemble

    def refuse_inner(code):
        if code is inner.__code__:
            raise ValueError("inner: ENTER_EXECUTOR at offset 4")
        return real(code)
    monkeypatch.setattr(translator, "disassemble", refuse_inner)
    translator._DISASSEMBLED.clear()
    ember.reset()
    x = torch.randn(3)
    for fn in (inner, outer):
        assert same(ember.compile(fn, backend="eager")(x), fn(x))
    assert ember.explain(inner)(x).graph_count == 0     # the frame itself: eager
    explained = ember.explain(outer)(x)                 # an inlined call: a graph break
    assert any("ENTER_EXECUTOR" in r.reason for r in explained.break_reasons)
    translator._DISASSEMBLED.clear()


def _show_executors(monkeypatch):
    """``dis`` shows an ENTER_EXECUTOR in place of every RETURN_VALUE."""
    real = bytecode.dis.get_instructions

    def with_executor(code):
        for raw in real(code):
            yield raw._replace(opname="ENTER_EXECUTOR") if raw.opname == "RETURN_VALUE" \
                else raw
    monkeypatch.setattr(bytecode.dis, "get_instructions", with_executor)


def test_disassemble_refuses_run_time_opcodes(monkeypatch):
    _show_executors(monkeypatch)
    try:
        bytecode.disassemble(inner.__code__)
    except ValueError as e:
        assert "ENTER_EXECUTOR" in str(e)
    else:
        raise AssertionError("ENTER_EXECUTOR was disassembled")


def test_a_frame_running_eagerly_with_run_time_opcodes_runs_as_written(monkeypatch):
    """Its calls are not routed to Ember (ember/frontend/eager_calls.py): no copy is made."""
    from ember.frontend.eager_calls import routed_code
    _show_executors(monkeypatch)
    assert routed_code(outer.__code__, lambda c: c) is None
