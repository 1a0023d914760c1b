"""The targets of the Triton tests, for ``pytest.mark.parametrize("target", TARGETS)``: CPU
tensors through Triton's interpreter (CI) and CUDA tensors in float32, float16 and bfloat16
(``gpu`` marker, the H200), each ``(device, dtype)``; and each dtype's tolerance."""
import os

import pytest
import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
TARGETS = [
    pytest.param(("cpu", torch.float32), id="interp-f32", marks=pytest.mark.skipif(
        not INTERPRETED, reason="Triton's interpreter is enabled only in processes started "
                                "with TRITON_INTERPRET=1 (tests/conftest.py does it without "
                                "a GPU)")),
    *[pytest.param(("cuda", dt), id=f"cuda-{name}", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available() or INTERPRETED, reason="needs a CUDA GPU")])
      for dt, name in ((torch.float32, "f32"), (torch.float16, "f16"),
                       (torch.bfloat16, "bf16"))],
]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}
