"""OpInfo conformance of the Triton target on a CUDA GPU, in float32, float16 and bfloat16.

The same ops, samples and comparison as ``test_opinfo.py`` (``opinfo_util``), on CUDA tensors:
the "ember" backend generates Triton kernels for them. Half precision is compared with a
floor of tolerance (``opinfo_util.HALF_TOLERANCE``): eager rounds after every op of a
composite, a fused kernel computes in float32 and rounds what it stores. Each dtype's totals
get their own line in the session summary. Runs on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu tests/backend/opinfo/test_opinfo_cuda.py``
(``EMBER_OPINFO_FULL=1`` / ``EMBER_OPINFO_K`` / ``EMBER_OPINFO_OPS`` work as for the CPU suites).
"""
from __future__ import annotations

import os

import pytest
import torch

from opinfo_util import RESULTS, op_full_name, run_op, selected_ops

pytest.importorskip("triton")
pytest.importorskip("expecttest", reason="torch's OpInfo database imports expecttest "
                                  "(in the test extra)")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a CUDA GPU (the interpreter runs CPU tensors only)")]
_OPS = selected_ops() if torch.cuda.is_available() else []
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("op", _OPS, ids=[op_full_name(op) for op in _OPS])
def test_opinfo_cuda(op, dtype):
    outcomes = run_op(op, device="cuda", dtypes=(dtype,))
    target = "cuda-" + str(dtype).replace("torch.", "")
    RESULTS[target][op_full_name(op)] = outcomes
    failures = [o for o in outcomes if o.category == "fail"]
    if failures:
        pytest.fail(f"{len(failures)}/{len(outcomes)} samples failed:\n" + "\n".join(
            o.line() for o in failures[:10]), pytrace=False)
