"""Graph breaks inside blocks of context managers the graph models (``torch.autocast``,
``torch.inference_mode``), and autocast that is already on when a compiled frame is called.

The graph before the break closes the open blocks, the instruction runs inside real ones, and
the resume function enters them again in its own graph; the frame computes what eager does
(dtypes included) and leaves autocast / grad mode as eager leaves them.
"""
import pytest
import torch

import ember
from conformance_util import _seed_rng, check  # noqa: F401
from ember.testing import CompileCounter, same


def _enters(gm) -> int:
    return sum(n.op == "call_function" and n.target is torch.amp.autocast_mode._enter_autocast
               for n in gm.graph.nodes)


# -- a break inside an autocast block ---------------------------------------------------------

def ac_print(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        print("ac-print", y.dtype, torch.is_autocast_enabled("cpu"))
        z = y @ w
    return z, z.dtype, (z.float() @ w).dtype, torch.is_autocast_enabled("cpu")


def test_break_inside_autocast_splits_like_grad_mode(capsys):
    # x @ w | print (inside a real autocast) | y @ w in autocast, z @ w after it
    cnt = CompileCounter()
    compiled = ember.compile(ac_print, backend=cnt)
    check(ac_print, (torch.randn(4, 4), torch.randn(4, 4)), graphs=2, rtol=1e-2, atol=1e-2)
    assert capsys.readouterr().out.count("ac-print torch.bfloat16 True") == 4
    assert not torch.is_autocast_enabled("cpu")
    compiled(torch.randn(4, 4), torch.randn(4, 4))
    assert cnt.frame_count == 2 and [_enters(g) for g in cnt.graphs] == [1, 1]


def ac_item(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        if y.float().sum().item() > 0:
            y = y @ w
        else:
            y = y @ w.t()
    return y, y.dtype


def test_item_branch_inside_autocast_both_ways():
    w = torch.randn(3, 3)
    check(ac_item, (torch.ones(2, 3), w.abs()), (-torch.ones(2, 3), w.abs()), graphs=3,
          rtol=1e-2, atol=1e-2)


def ac_loop(x, n):
    out = []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for i in range(n):
            x = torch.mm(x, x.t())
            print("ac-loop", i, x.dtype)
            out.append(x.dtype)
    return x.float(), out


def test_break_inside_a_loop_inside_autocast(capsys):
    check(ac_loop, (torch.randn(3, 3) / 3, 3), graphs=4, rtol=2e-2, atol=2e-2)
    assert capsys.readouterr().out.count("ac-loop 2 torch.bfloat16") == 4


def ac_nested(x, w, log):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            y = x @ w
            log.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")))
            print("ac-nested")
            y = y @ w
        z = x @ w
    return y, z, torch.is_grad_enabled(), z.requires_grad


def test_break_inside_no_grad_inside_autocast():
    x = torch.randn(2, 3, requires_grad=True)
    check(ac_nested, (x, torch.randn(3, 3), []), graphs=2, rtol=1e-2, atol=1e-2)
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")


def ac_disabled_inner(x, w, log):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = x @ w
        with torch.autocast("cpu", enabled=False):
            b = x @ w
            log.append(torch.is_autocast_enabled("cpu"))
            print("ac-disabled-inner")
            c = b @ w
        d = a @ w
    return a.dtype, b.dtype, c.dtype, d.dtype, c, d


def test_break_inside_nested_autocast_blocks():
    check(ac_disabled_inner, (torch.randn(2, 3), torch.randn(3, 3), []), graphs=2,
          rtol=1e-2, atol=1e-2)


def ac_raises(x, log):
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ x
            log.append(torch.is_autocast_enabled("cpu"))
            y = y + [][0]           # IndexError at the break, through the block's exit
    except IndexError:
        log.append(("caught", torch.is_autocast_enabled("cpu")))
        y = x @ x
    return y, y.dtype


def test_exception_at_break_inside_autocast_exits_it():
    check(ac_raises, (torch.randn(3, 3), []), graphs=None)
    assert not torch.is_autocast_enabled("cpu")


def ac_manual(x):
    ctx = torch.autocast("cpu", dtype=torch.bfloat16)
    ctx.__enter__()
    y = x @ x
    print("ac-manual")
    ctx.__exit__(None, None, None)
    return y


def test_autocast_entered_without_with_is_not_split():
    # the resume could not enter it again: the frame runs eagerly, still right
    explained = ember.explain(ac_manual)(torch.randn(2, 2))
    assert explained.graph_count == 0
    assert not torch.is_autocast_enabled("cpu")
    check(ac_manual, (torch.randn(2, 2),), graphs=0)


@pytest.mark.parametrize("backend", [None, "ember"])
def test_break_inside_autocast_through_the_compiler(backend):
    cnt = CompileCounter(backend)
    compiled = ember.compile(ac_print, backend=cnt)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    for _ in range(2):
        got, want = compiled(x, w), ac_print(x, w)
        assert got[1:] == want[1:]
        assert same(got[0], want[0], rtol=1e-2, atol=1e-2)
    assert cnt.frame_count == 2


# -- inference mode ---------------------------------------------------------------------------

def im_print(x, log):
    with torch.inference_mode():
        y = x * 2
        log.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        print("im-print", y.is_inference())
        z = y + 1
    return z, z.is_inference(), torch.is_grad_enabled(), torch.is_inference_mode_enabled()


def test_break_inside_inference_mode():
    check(im_print, (torch.randn(3, requires_grad=True), []), graphs=2)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


# -- autocast already on when the compiled frame is called ------------------------------------

def ambient(x, w):
    return (x @ w).relu()


@pytest.mark.parametrize("backend", [None, "ember"])
def test_autocast_on_at_the_call_recompiles_and_matches(backend):
    """Called outside then inside autocast, and the other way round: each state has its own
    graph (the autocast state is guarded), with autocast's casts in it."""
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    for first_inside in (False, True):
        cnt = CompileCounter(backend)
        compiled = ember.compile(ambient, backend=cnt)
        for inside in (first_inside, not first_inside, first_inside):
            if inside:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    got, want = compiled(x, w), ambient(x, w)
            else:
                got, want = compiled(x, w), ambient(x, w)
            assert got.dtype == want.dtype
            assert same(got, want, rtol=1e-2, atol=1e-2)
        assert cnt.frame_count == 2
        inside_graph = cnt.graphs[1 if not first_inside else 0]
        assert _enters(inside_graph) == 1


def test_autocast_dtype_change_recompiles():
    cnt = CompileCounter()
    compiled = ember.compile(ambient, backend=cnt)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
        with torch.autocast("cpu", dtype=dtype):
            assert compiled(x, w).dtype == ambient(x, w).dtype == dtype
    assert cnt.frame_count == 2


def ambient_break(x, w):
    y = x @ w
    print("ambient-break", y.dtype)
    return y @ w


def test_break_in_a_frame_called_under_autocast(capsys):
    cnt = CompileCounter()
    compiled = ember.compile(ambient_break, backend=cnt)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = compiled(x, w), ambient_break(x, w)
    assert got.dtype == want.dtype == torch.bfloat16
    assert same(got, want, rtol=1e-2, atol=1e-2)
    assert capsys.readouterr().out.count("ambient-break torch.bfloat16") == 2
    assert cnt.frame_count == 2


def no_ops(x, n):
    return n + 1


def test_frame_without_ops_under_autocast_has_no_graph():
    cnt = CompileCounter()
    compiled = ember.compile(no_ops, backend=cnt)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compiled(torch.randn(2), 3) == 4
    assert cnt.frame_count == 0


# -- profiler ranges: captured as no-ops (issue 33: DDP's forward opens one) ------------------

_range = torch.autograd.profiler.record_function("decorated")


@_range
def _ranged_cos(x):
    return x.cos()


@torch.profiler.record_function("decorated2")
def _ranged_exp(x):
    return x.exp()


def profiled(x):
    with torch.autograd.profiler.record_function("a") as r:
        y = x.sin()
    with torch.profiler.record_function("b"):
        y = y + 1
    with torch.autograd.profiler.emit_nvtx(enabled=False):
        y = y * 3
    with torch.autograd.profiler.emit_itt(enabled=False):
        y = y - 1
    return _ranged_exp(_ranged_cos(y)), r is not None


def test_profiler_ranges_are_one_graph():
    cnt = check(profiled, (torch.randn(4, 5),), graphs=1)
    assert not any(n.op == "call_function" and "profiler" in str(n.target)
                   for g in cnt.graphs for n in g.graph.nodes)


def profiled_print(x):
    with torch.autograd.profiler.record_function("a"):
        y = x.sin()
        print("in-range")
        y = y + 1
    return y


def test_break_inside_profiler_range(capsys):
    check(profiled_print, (torch.randn(4),), graphs=2)
    assert capsys.readouterr().out.count("in-range") == 4


def profiled_decorated_inside(x):
    ranged = torch.autograd.profiler.record_function("inner")(torch.cos)
    return ranged(x), ranged


def test_profiler_range_as_decorator_inside_the_frame():
    x = torch.randn(4)
    out, ranged = ember.compile(profiled_decorated_inside, backend=CompileCounter())(x)
    same(out, x.cos())
    same(ranged(x), x.cos())    # rebuilt decorated: callable outside the graph


def test_profiler_range_under_a_running_profiler_matches():
    # the profiler records the compiled graph's ops, not the range, and the values are eager's
    x = torch.randn(4, 5)
    compiled = ember.compile(profiled, backend=CompileCounter())
    compiled(x)
    with torch.profiler.profile() as prof:
        out = compiled(x)
    same(out[0], profiled(x)[0])
    assert "a" not in {e.name for e in prof.events()}
