"""Programs whose bytecode differs between CPython versions (3.13's super-instructions,
TO_BOOL, CALL_KW, the NULL above the callable, ...) compile to the same graphs on every
supported version and compute what eager computes, also with a graph break at those
instructions. On 3.13 each listed instruction is checked to occur, so a compiler change that
stops exercising one is noticed."""
import copy
import dis
import sys

import pytest
import torch

import ember
from ember.testing import CompileCounter, same

from programs import (break_at_call_ex, break_at_call_kw, break_at_format, break_in_loop,
                      break_on_compare, break_on_not, break_on_truth, break_with_closure,
                      break_with_many_locals, comprehension, formatting, keyword_calls,
                      make_functions, method_and_global_calls, pair_load, pair_store,
                      return_const, star_calls, truth_and_compare)
import programs

PY313 = sys.version_info[:2] == (3, 13)


def _inputs(*shape):
    return torch.randn(*shape)


# (program, argument sets, graphs over all argument sets, graph breaks on the first set);
# the counts are those of 3.11, where the frontend began
CASES = [
    (pair_load, [(_inputs(3), _inputs(3))], 1, 0),
    (pair_store, [(_inputs(4, 2),)], 1, 0),
    (truth_and_compare, [(_inputs(3), True, 3), (_inputs(3), False, 1)], 2, 0),
    (keyword_calls, [(_inputs(3, 2),)], 1, 0),
    (star_calls, [(_inputs(3),)], 1, 0),
    (formatting, [(_inputs(3, 2),)], 1, 0),
    (make_functions, [(_inputs(3),)], 1, 0),
    (comprehension, [(_inputs(3, 2),)], 1, 0),
    (method_and_global_calls, [(_inputs(3),)], 1, 0),
    (return_const, [(_inputs(3), _inputs(3))], 1, 0),
    (break_at_call_kw, [(_inputs(3),)], 2, 1),
    (break_at_call_ex, [(_inputs(3),)], 2, 1),
    (break_on_compare, [(_inputs(3).abs(),), (-_inputs(3).abs(),)], 3, 1),
    (break_on_truth, [(_inputs(3).abs() + 1,), (torch.zeros(3),)], 3, 1),
    (break_on_not, [(_inputs(3).abs(),)], 2, 1),
    (break_at_format, [(_inputs(3),)], 2, 1),
    (break_in_loop, [(_inputs(3, 2),)], 3, 3),
    (break_with_closure, [(_inputs(3),)], 2, 1),
    (break_with_many_locals, [(_inputs(3),)], 2, 1),
]


@pytest.mark.parametrize("fn,arg_sets,graphs,breaks", CASES, ids=[c[0].__name__ for c in CASES])
def test_compiled_matches_eager_with_the_same_graphs(fn, arg_sets, graphs, breaks):
    ember.reset()
    counter = CompileCounter()
    compiled = ember.compile(fn, backend=counter)
    for args in arg_sets:
        eager_args, compiled_args = copy.deepcopy(args), copy.deepcopy(args)
        expected = fn(*eager_args)
        for _ in range(2):   # the second call runs the cached entries
            got = compiled(*compiled_args)
            assert same(got, expected), fn.__name__
        if fn is return_const:     # the in-place update ran twice: once more in eager
            fn(*eager_args)
        assert same(list(compiled_args), list(eager_args))
    assert counter.frame_count == graphs
    ember.reset()
    explained = ember.explain(fn)(*copy.deepcopy(arg_sets[0]))
    assert not any(r.frame_ran_eagerly for r in explained.break_reasons), \
        [str(r) for r in explained.break_reasons]
    assert len(explained.break_reasons) == breaks


def _opnames(fn):
    names = {i.opname for i in dis.get_instructions(fn)}
    for const in fn.__code__.co_consts:     # nested code (lambdas, inner functions)
        if hasattr(const, "co_code"):
            names |= {i.opname for i in dis.get_instructions(const)}
    return names


@pytest.mark.skipif(not PY313, reason="the instructions CPython 3.13 compiles")
def test_programs_cover_the_313_instructions():
    seen = set()
    for name in dir(programs):
        fn = getattr(programs, name)
        if callable(fn) and getattr(fn, "__module__", None) == programs.__name__:
            seen |= _opnames(fn)
    wanted = {"LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST",
              "TO_BOOL", "CALL_KW", "CALL_FUNCTION_EX", "CONVERT_VALUE", "FORMAT_SIMPLE",
              "FORMAT_WITH_SPEC", "SET_FUNCTION_ATTRIBUTE", "LOAD_FAST_AND_CLEAR",
              "RETURN_CONST", "PUSH_NULL", "END_FOR", "COMPARE_OP", "UNARY_NOT"}
    assert wanted <= seen, wanted - seen
