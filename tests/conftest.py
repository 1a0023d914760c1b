"""Settings every test process and every test shares.

- Without a CUDA GPU, ``TRITON_INTERPRET=1`` is set here, before anything imports Triton
  (its interpreter must be chosen then), so the Triton target's tests
  (``backend/targets/triton_target/test_triton.py``) run generated kernels on CPU tensors.
- Every test runs the compiler strictly, so a bug raises instead of being papered over:
  ``config.fallback_on_lowering_error=False`` makes a lowering that raises anything but
  ``NotImplementedError`` (its way of declining a case) an error rather than an ATen
  fallback, and ``config.suppress_errors=False`` lets an error while compiling a graph
  (such as that one) reach the test instead of the graph running as captured. Users keep
  both defaults (True); a test of the lenient behaviour patches them back.
- The on-disk graph cache is off (``EMBER_GRAPH_CACHE=0``): a test that patches the code
  generator (a smaller persistent-reduction limit, say) must compile, not load an earlier
  test's kernels. ``backend/runtime/test_graph_cache.py`` turns it on for itself.
- Choosing eager over a slower compiled graph is off (``EMBER_EAGER_CHOICE=off``): a test of
  the generated code must run it, not eager's kernels, and a timing must not decide what a
  test runs. ``backend/runtime/test_eager_choice.py`` turns it on per compile
  (``options={"eager_choice": "timed"}``) with its timings forced.
"""
from __future__ import annotations

import logging
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["EMBER_GRAPH_CACHE"] = "0"
os.environ["EMBER_EAGER_CHOICE"] = "off"

from ember import config, logs  # noqa: E402  (after TRITON_INTERPRET is decided)


@pytest.fixture(autouse=True)
def _strict_compiler():
    with config.patch(fallback_on_lowering_error=False, suppress_errors=False):
        yield


@pytest.fixture
def ember_log(caplog):
    """caplog that sees Ember's loggers; the logging setup is restored afterwards."""
    root = logging.getLogger("ember")
    handlers, propagate = list(root.handlers), root.propagate
    was_on = [a for a in logs.ARTIFACTS if logs.enabled(a)]
    root.addHandler(caplog.handler)
    with caplog.at_level(logging.INFO, logger="ember"):
        yield caplog
    logs.set_logs(",".join(was_on))
    root.handlers[:] = handlers
    root.propagate = propagate
