"""OpInfo conformance of the Triton target, run by Triton's interpreter on CPU tensors.

The same ops, dtypes (float32, int64, bool) and comparison as ``test_opinfo.py``, compiled
with ``cpu_backend="triton"``: the kernels a GPU would get, executed by the interpreter, so
CI checks the generated Triton without a GPU. Its totals get their own line in the session
summary (``conftest.py``).

CI mode: the same ops and samples as the C++ suite (2 per (op, dtype)). OpInfo's samples
are small, so their kernels are a few program instances each (~0.5 ms apiece under the
interpreter): the suite takes about 30 s on 2 cores and needs no sampling of its own (the
full sweep, ``EMBER_OPINFO_FULL=1``, about 12 minutes).
``EMBER_OPINFO_FULL=1`` / ``EMBER_OPINFO_K`` / ``EMBER_OPINFO_OPS`` work as for the C++ suite.

The interpreter must be chosen before Triton is imported: the suite runs only in a process
where ``TRITON_INTERPRET=1`` (tests/conftest.py sets it when there is no CUDA GPU).
"""
from __future__ import annotations

import os

import pytest

from opinfo_util import RESULTS, op_full_name, run_op, selected_ops

# {op full name: reason}: known failures of the Triton target alone, each verified to come
# from the backend (XPASS, not an error, once they pass).
XFAIL: dict[str, str] = {}

pytest.importorskip("triton")
pytest.importorskip("expecttest", reason="torch's OpInfo database imports expecttest "
                                  "(in the test extra)")
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="Triton's interpreter runs only in processes started with TRITON_INTERPRET=1 "
           "(tests/conftest.py sets it when there is no CUDA GPU)")
_OPS = selected_ops()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # the interpreter's numpy on inf/nan
@pytest.mark.parametrize("op", _OPS, ids=[op_full_name(op) for op in _OPS])
def test_opinfo_triton(op, request):
    name = op_full_name(op)
    if name in XFAIL:
        request.node.add_marker(pytest.mark.xfail(reason=XFAIL[name], strict=False))
    outcomes = run_op(op, cpu_backend="triton")
    RESULTS["triton"][name] = outcomes
    failures = [o for o in outcomes if o.category == "fail"]
    if failures:
        pytest.fail(f"{len(failures)}/{len(outcomes)} samples failed:\n" + "\n".join(
            o.line() for o in failures[:10]), pytrace=False)
