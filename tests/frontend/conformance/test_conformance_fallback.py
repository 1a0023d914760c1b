"""Conformance: frames the frontend cannot put in one graph must still run correctly.

By default these tests expect graph breaks: TorchDynamo's counts where they are unambiguous
(graph before the break + graph of the resume function), no count where it depends on
specialisation details. With ``EMBER_CONFORMANCE_GRAPH_BREAKS=0`` they expect a frontend that
runs such frames eagerly (no graph reaches the backend).
"""
import pytest
import torch

import ember
from conformance_util import _seed_rng, check, graph_breaks_enabled  # noqa: F401


def expect(with_breaks):
    """Graph count: ``with_breaks``, or 0 for a frontend that runs the frame eagerly."""
    return with_breaks if graph_breaks_enabled() else 0


def fb_print(x):
    y = x * 2
    print("ember-conformance-print", y.shape[0])
    return y + 1


def test_print_call(capsys):
    check(fb_print, (torch.randn(3),), graphs=expect(2))
    printed = capsys.readouterr().out.count("ember-conformance-print 3")
    assert printed == 4, f"print must run once per call (2 sets x eager/compiled), ran {printed}"


def fb_item_control_flow(x):
    s = x.sum().item()
    if s > 0:
        return x + 1
    return x - 1


def test_item_control_flow_positive():
    a = (torch.rand(4) + 0.1,)
    b = (torch.rand(4) + 0.2,)
    check(fb_item_control_flow, a, b, graphs=expect(None))


def test_item_control_flow_takes_both_branches():
    check(fb_item_control_flow, (torch.rand(4) + 0.1,), (-torch.rand(4) - 0.1,),
          graphs=expect(None))


def fb_tensor_bool(x):
    if x.sum() > 0:
        return x * 2
    return x * 3


def test_bool_of_tensor_control_flow():
    check(fb_tensor_bool, (torch.rand(4) + 0.1,), (torch.rand(4) + 0.3,), graphs=expect(2))


def test_bool_of_tensor_both_branches():
    check(fb_tensor_bool, (torch.rand(4) + 0.1,), (-torch.rand(4) - 0.1,), graphs=expect(3))


def fb_explicit_bool_any(x):
    y = x.relu()
    if bool((y > 5).any()):
        y = y - 5
    return y


def test_explicit_bool_any():
    check(fb_explicit_bool_any, (torch.rand(5),), (torch.rand(5),), graphs=expect(None))


def fb_data_dependent_while(x):
    n = 0
    while x.abs().max() < 8:
        x = x * 2
        n += 1
    return x, n


def test_data_dependent_while():
    check(fb_data_dependent_while, (torch.full((3,), 1.5),), (torch.full((3,), 1.25),),
          graphs=expect(None))


def fb_int_of_tensor_as_index(x, table):
    i = int(x.argmax())
    return table[i] * x


def test_int_of_tensor_indexes_python_list():
    table = [1.0, 2.0, 3.0, 4.0]
    check(fb_int_of_tensor_as_index, (torch.tensor([0.0, 5.0, 1.0, 2.0]), table),
          (torch.tensor([0.5, 6.0, 1.0, 2.0]), table), graphs=expect(None))


def fb_tolist(x):
    vals = x.tolist()
    return x * len(vals) + vals[0]


def test_tolist():
    check(fb_tolist, (torch.randn(3),), graphs=expect(None))


@ember.disable
def _eager_only(x):
    return x * 10


def fb_calls_disabled(x):
    y = x + 1
    z = _eager_only(y)
    return z - 1


def test_call_to_disabled_function():
    check(fb_calls_disabled, (torch.randn(3),), graphs=expect(2))


def fb_shape_error(x, y):
    z = x * 2
    return z + y            # shapes (3,) and (4,) do not broadcast


def test_runtime_error_from_op_has_same_type():
    check(fb_shape_error, (torch.randn(3), torch.randn(4)), graphs=expect(None),
          raises=RuntimeError)


def fb_python_raise(x, n):
    y = x + 1
    if n > 2:
        raise ValueError(f"n too large: {n}")
    return y


def test_python_raise_same_exception():
    check(fb_python_raise, (torch.randn(3), 5), graphs=expect(None), raises=ValueError)


def fb_index_error(x, lst):
    return x * lst[5]


def test_python_index_error():
    check(fb_index_error, (torch.randn(3), [1, 2]), graphs=0, raises=IndexError)


def fb_nonzero(x):
    idx = torch.nonzero(x > 0)
    return idx.shape[0], x[x > 0].sum()


def test_data_dependent_output_shape():
    check(fb_nonzero, (torch.tensor([1.0, -1.0, 2.0, -3.0]),),
          (torch.tensor([2.0, -1.0, 3.0, -3.0]),), graphs=expect(None))
