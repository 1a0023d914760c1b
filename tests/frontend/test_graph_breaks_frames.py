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
