"""Graph breaks whose resume functions are captured rather than run eagerly: values held
on the stack below the break (a container's bound method), and resume functions that start
at an exception handler. Outputs and Python state are compared with eager, and the number
of graphs is asserted.
"""
import sys

import torch

import ember
from conformance_util import _seed_rng, check  # noqa: F401


def fr_append_item(x, log):
    y = x * 2
    log.append(y.sum().item())
    return y + 1


def fr_append_item_compared(x, log):
    y = x * 2
    log.append(y.sum().item() > 0)      # the comparison reads the float: guarded
    return y + 1


def test_container_method_below_the_break_is_tracked():
    # x * 2, sum | .item() | the append (the float is not read) and y + 1
    check(fr_append_item, (torch.randn(4), []), graphs=2)
    check(fr_append_item_compared, (torch.randn(4), []), graphs=None)
    for fn in (fr_append_item, fr_append_item_compared):
        explained = ember.explain(fn)(torch.randn(4), [])
        assert explained.graph_count == 2
        assert not any(r.frame_ran_eagerly for r in explained.break_reasons)


def fr_dict_and_set_methods(x, table, seen):
    y = x.relu()
    table.setdefault("sum", []).append(y.sum().item())
    seen.add(int(x.max().item() > 0))
    return y * 3


def test_dict_and_set_methods_below_breaks():
    check(fr_dict_and_set_methods, (torch.randn(4), {}, set()), graphs=None)
    explained = ember.explain(fr_dict_and_set_methods)(torch.randn(4), {}, set())
    assert not any(r.frame_ran_eagerly for r in explained.break_reasons)


# -- resume functions that start at an exception handler --------------------------------------

def fr_handler(x, lst, log):
    y = x + 1
    try:
        z = y * lst[5]              # IndexError at the break
    except (KeyError, IndexError) as e:
        log.append(type(e).__name__)
        z = y - 1
    return z * 2


def test_resume_at_an_exception_handler_is_captured():
    # x + 1 | lst[5] raises | the handler and the rest, in one graph
    check(fr_handler, (torch.randn(3), [1, 2], []), graphs=2)
    explained = ember.explain(fr_handler)(torch.randn(3), [1, 2], [])
    assert explained.graph_count == 2
    assert not any(r.frame_ran_eagerly for r in explained.break_reasons)


def fr_finally(x, lst, log):
    y = x * 2
    try:
        y = y + lst[5]
    finally:
        log.append("finally")
        y = y * 3                   # dead: the exception propagates
    return y


def test_finally_handler_runs_and_reraises():
    check(fr_finally, (torch.randn(3), [1], []), graphs=None, raises=IndexError)


def fr_handler_breaks(x, lst, log):
    y = x + 1
    try:
        z = y * lst[5]
    except IndexError:
        log.append(sys.exc_info()[0].__name__)    # the exception must be the one handled
        print("fr-handler-breaks")
        z = y - 1
    return z


def test_break_inside_a_captured_handler_is_refused():
    check(fr_handler_breaks, (torch.randn(3), [1], []), graphs=None)
    explained = ember.explain(fr_handler_breaks)(torch.randn(3), [1], [])
    assert [r.frame_ran_eagerly for r in explained.break_reasons] == [False, True]


def test_handler_resume_restores_the_callers_exception():
    compiled = ember.compile(fr_handler)

    def caller(fn):
        try:
            raise KeyError("the caller's")
        except KeyError:
            out = fn(torch.ones(2), [1], [])
            return out, sys.exc_info()[1].args

    want, got = caller(fr_handler), caller(compiled)
    assert torch.equal(want[0], got[0]) and want[1] == got[1] == ("the caller's",)


# -- iterators held in locals across a break ----------------------------------------------------

def fr_iterator_local(x, xs):
    it = iter(xs)
    first = next(it)
    print("fr-iter")                # the break: `it` is live, one item consumed
    total = x
    for v in it:
        total = total + v
    return total * first, list(it)


def fr_iterator_local_and_loop(x, xs):
    """Was a silent wrong result: the loop's iterator and the local were rebuilt as two
    objects, so the loop's progress after the break did not show through `it`."""
    it = iter(xs)
    for v in it:
        if v == 2:
            print("fr-iter-loop")   # the break inside the loop over `it`
        x = x + v
        if v == 3:
            break
    return x, list(it)


def fr_iterator_two_names(x, xs):
    it = iter(xs)
    alias = it
    next(it)
    print("fr-iter-two")
    a = next(alias)
    b = next(it)
    return x + a * 10 + b, list(alias)


def fr_endless_iterator(x):
    import itertools
    for i in itertools.count():
        if i == 2:
            print("fr-count")       # the iterator cannot be rebuilt: the frame runs eagerly
        if i > 4:
            break
        x = x + i
    return x


def test_iterator_in_a_local_crosses_the_break():
    check(fr_iterator_local, (torch.randn(3), [1, 2, 3, 4]), graphs=1)
    check(fr_iterator_local_and_loop, (torch.randn(3), [1, 2, 3, 4]), graphs=None)
    check(fr_iterator_two_names, (torch.randn(3), [1, 2, 3, 4]), graphs=1)
    check(fr_endless_iterator, (torch.randn(3),), graphs=None)
    for fn, args in ((fr_iterator_local, (torch.randn(3), [1, 2, 3, 4])),
                     (fr_iterator_local_and_loop, (torch.randn(3), [1, 2, 3, 4])),
                     (fr_iterator_two_names, (torch.randn(3), [1, 2, 3, 4]))):
        explained = ember.explain(fn)(*args)
        assert not any(r.frame_ran_eagerly for r in explained.break_reasons), fn.__name__


# -- functions the frame makes, held in its cells ----------------------------------------------

def fr_lambdas_in_cells(x, k):
    g = lambda t: t * k             # noqa: E731  (g is a cell: h closes over it)
    h = lambda t: g(t) + 1          # noqa: E731
    print("fr-lambdas")
    return h(x) + g(x)


def test_lambdas_in_cells_do_not_recompile_the_resume():
    from ember.testing import CompileCounter
    cnt = CompileCounter()
    compiled = ember.compile(fr_lambdas_in_cells, backend=cnt)
    x = torch.randn(3)
    for _ in range(4):
        assert torch.equal(compiled(x, 2), fr_lambdas_in_cells(x, 2))
    assert cnt.frame_count == 1     # a new lambda on each call: guarded by its code and cells
    assert torch.equal(compiled(x, 3), fr_lambdas_in_cells(x, 3))   # k is guarded
    assert cnt.frame_count == 2


# -- a with block's handler: __exit__ with the exception ---------------------------------------

class _Suppress:
    def __init__(self, log, kind):
        self.log, self.kind = log, kind

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, typ, val, tb):
        self.log.append(typ.__name__ if typ is not None else None)
        return typ is self.kind


def fr_with_suppressed(x, log, lst):
    with _Suppress(log, IndexError):
        y = x + 1
        y = y * lst[5]              # IndexError at the break: __exit__ suppresses it
    return y * 2


def fr_with_not_suppressed(x, log, lst):
    with _Suppress(log, IndexError):
        y = x + 1
        y = y * lst[0]["k"]         # TypeError: __exit__ returns False, it propagates
    return y * 2


def fr_no_grad_exception(x, lst):
    try:
        with torch.no_grad():
            y = x * 2
            y = y + lst[5]          # IndexError inside no_grad: __exit__ restores grad mode
    except IndexError:
        y = x * 3
    return y, torch.is_grad_enabled()


def test_with_block_handler_is_captured():
    # x + 1 | lst[5] raises | __exit__ (suppresses) and y * 2
    check(fr_with_suppressed, (torch.randn(3), [], [1]), graphs=2)
    explained = ember.explain(fr_with_suppressed)(torch.randn(3), [], [1])
    assert explained.graph_count == 2
    assert not any(r.frame_ran_eagerly for r in explained.break_reasons)
    check(fr_with_not_suppressed, (torch.randn(3), [], [1]), graphs=None, raises=TypeError)
    check(fr_no_grad_exception, (torch.randn(3, requires_grad=True), [1]), graphs=None)


def _write_after_break(x):
    y = x * 2
    print("a break")
    y[0] = 0                 # in place on an intermediate that requires grad
    return (y.sin() * 3).sum()


def test_intermediate_written_in_place_after_a_break_needs_no_second_break(capsys):
    """The resume graph receives ``y`` (requires grad, has a grad_fn) as an input; its fake is
    a non-leaf as ``y`` is, so the in-place write is captured instead of breaking again;
    value and gradient match eager's."""
    x = torch.randn(4, requires_grad=True)
    explained = ember.explain(_write_after_break)(x)
    assert explained.graph_break_count == 1, explained.break_reasons
    check(_write_after_break, (x,), backward=True, graphs=2)
