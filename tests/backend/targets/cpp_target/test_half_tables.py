"""Half-precision lookup tables (``strategies/table.py``): a pointwise kernel of one float16
or bfloat16 input reads its results from tables its first call fills with the same element
code, so its bits equal the direct loop's for every one of the 65536 inputs (nan, inf, -0.0
and subnormals among them), and eager's within the usual tolerances. Float32 inputs,
arithmetic alone, kernels of two inputs and small ones keep the direct loop."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.backend.targets.cpp.strategies import table
from ember.testing import run_and_get_code

pytestmark = pytest.mark.usefixtures("fresh_no_grad")

_REPEAT = 4          # every bit pattern 4 times: TABLE_MIN_ELEMENTS elements
_CHAINS = {"gelu": lambda t: F.gelu(t), "silu": lambda t: F.silu(t),
           "tanh": lambda t: torch.tanh(t), "gelu_then_scale": lambda t: F.gelu(t) * 2 - 1}


def _every_value(dtype: torch.dtype) -> torch.Tensor:
    bits = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16)
    return bits.view(dtype).repeat(_REPEAT, 1)


def _assert_eagers(got, x, fn, atol=1e-2):
    """Within half precision's tolerances of eager (a chain rounds once, eager every op),
    NaN, -0.0 and subnormals included; not from 2^127 on, where eager's GELU doubles x to
    inf (see ``ember_gelu_f``), nor at inf, where it is NaN in its vector loop and inf in
    its scalar tail: the direct loop's results there, which the table's equal bit for bit."""
    keep = x.isnan() | (x.float().abs() < 2.0 ** 127)
    torch.testing.assert_close(got[keep], fn(x)[keep], equal_nan=True, atol=atol, rtol=1.6e-2)


def _compiled(fn, *args, tables: bool):
    """(the outputs, the generated source) with the table path on or off."""
    enabled = table._ENABLED
    table._ENABLED = tables
    try:
        ember.reset()
        out, sources = run_and_get_code(fn, *args)
    finally:
        table._ENABLED = enabled
    return out, "\n".join(sources)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(_CHAINS))
def test_table_path_equals_the_direct_loop_bit_for_bit(dtype, name):
    fn, x = _CHAINS[name], _every_value(dtype)
    got, source = _compiled(fn, x, tables=True)
    assert "_fill_tables" in source, source
    direct, direct_source = _compiled(fn, x, tables=False)
    assert "_fill_tables" not in direct_source
    assert torch.equal(got.view(torch.int16), direct.view(torch.int16))
    _assert_eagers(got, x, fn)


def test_two_outputs_of_one_input():
    x = _every_value(torch.bfloat16)
    fn = lambda t: (F.gelu(t), torch.sigmoid(t) * t)   # noqa: E731
    (a, b), source = _compiled(fn, x, tables=True)
    assert source.count("_table_") >= 4, source
    (da, db), _ = _compiled(fn, x, tables=False)
    assert torch.equal(a.view(torch.int16), da.view(torch.int16))
    assert torch.equal(b.view(torch.int16), db.view(torch.int16))


@pytest.mark.parametrize("case", ["float32", "cheap", "polynomial", "two_inputs", "small"])
def test_table_path_not_taken(case):
    x = _every_value(torch.bfloat16)
    fn = _CHAINS["gelu"]
    args = (x,)
    if case == "float32":
        args = (torch.randn(4, 65536),)
    elif case == "cheap":
        fn = lambda t: t * 2 + 1   # noqa: E731
    elif case == "polynomial":     # computed faster than looked up, however many ops
        fn = lambda t: (((t * 2 + 1) * t - 3) * t + 0.5) * t - 0.25   # noqa: E731
        args = (torch.rand(4, 65536).to(torch.bfloat16),)    # no cancellation past 1
    elif case == "two_inputs":
        fn = lambda t, u: F.gelu(t + u)   # noqa: E731
        args = (x, torch.randn(x.shape).to(x.dtype))
    elif case == "small":
        args = (x[:1],)
    ember.reset()
    out, sources = run_and_get_code(fn, *args)
    assert "_fill_tables" not in "\n".join(sources)
    # (eager rounds each of the polynomial's 8 ops to bfloat16)
    _assert_eagers(out, args[0], lambda _: fn(*args), atol=3e-2 if case == "polynomial" else 1e-2)


def test_in_place_between_matmuls(monkeypatch):
    """GELU inside an MLP writes over the matmul's dying result (one buffer, in place); the
    matmuls are bf16 ones (on a CPU without bf16 GEMMs Ember would multiply in float32)."""
    from ember.backend.targets import CpuPolicy
    monkeypatch.setattr(CpuPolicy, "upcasts_half_matmuls", lambda self, dtype: False)
    x = torch.randn(512, 512, dtype=torch.bfloat16)
    w = torch.randn(512, 512, dtype=torch.bfloat16) / 16
    fn = lambda t, u: F.gelu(t @ u) @ u   # noqa: E731
    got, source = _compiled(fn, x, w, tables=True)
    assert "_fill_tables" in source and source.count("uint16_t* p_") == 1, source
    direct, _ = _compiled(fn, x, w, tables=False)
    assert torch.equal(got, direct)
    torch.testing.assert_close(got, fn(x, w), atol=5e-2, rtol=1.6e-2)


@pytest.mark.parametrize("name", ["float32", "bool", "int32"])
def test_outputs_of_other_dtypes(name):
    """Tables of float32, bool and int32 results (4 bytes at most an entry)."""
    fn = {"float32": lambda t: F.gelu(t).float() * 3, "bool": lambda t: F.gelu(t) > 0.1,
          "int32": lambda t: torch.sigmoid(t).mul(100).to(torch.int32)}[name]
    x = _every_value(torch.bfloat16)
    got, source = _compiled(fn, x, tables=True)
    assert "_fill_tables" in source, source
    direct, _ = _compiled(fn, x, tables=False)
    bits = {torch.float32: torch.int32, torch.bool: torch.uint8}.get(got.dtype, got.dtype)
    assert torch.equal(got.view(bits), direct.view(bits))
