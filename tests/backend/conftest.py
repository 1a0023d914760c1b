"""Shared by the backend tests:

- ``cpu_backend``: a fixture that runs a test once per CPU target, ``cpp`` (C++/OpenMP) and
  ``triton-interp`` (Triton kernels run by Triton's interpreter, skipped unless the process
  has ``TRITON_INTERPRET=1``). It sets the default of the ``cpu_backend`` option, so every
  ``ember.compile(..., backend="ember")`` in the test (``run_and_get_code`` too) generates
  for that target; its value is the target's name.
- ``fresh_no_grad``: a reset Ember, seed 0, internal errors raised, grad off (tests select it
  with ``pytestmark = pytest.mark.usefixtures("fresh_no_grad")``).
- the session summary of the OpInfo conformance suites (``opinfo/test_opinfo.py``: C++
  kernels, ``opinfo/test_opinfo_triton.py``: Triton kernels under the interpreter), one line
  per target run.

The backend's tests live in one folder per concept below this one (this conftest applies to
them all). Helpers are imported as top-level modules (``from triton_targets import
TARGETS``), found because pytest's default ("prepend") import mode puts each test file's own
folder on ``sys.path``; a helper used from another folder needs its folder added here:
``fuzz/``, for ``lowering/test_int_division.py`` takes its zero divisors from
``fuzz_int_extremes``.
"""
from __future__ import annotations

import dataclasses
import os
import sys

import pytest

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

FUZZ = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz")
if FUZZ not in sys.path:
    sys.path.insert(0, FUZZ)


@pytest.fixture
def received(monkeypatch):
    """The keywords each compile_graph call received (the graph then runs as captured)."""
    from ember.backend import compile as backend_compile
    calls: list[dict] = []

    def fake_compile_graph(gm, example_inputs, **options):
        calls.append(options)
        return gm.forward
    monkeypatch.setattr(backend_compile, "compile_graph", fake_compile_graph)
    return calls


@pytest.fixture
def fresh_no_grad():
    import torch

    import ember
    from ember import config
    ember.reset()
    torch.manual_seed(0)
    with config.patch(suppress_errors=False), torch.no_grad():
        yield


@pytest.fixture(params=[
    pytest.param("cpp", id="cpp"),
    pytest.param("triton", id="triton-interp", marks=pytest.mark.skipif(
        not INTERPRETED, reason="Triton's interpreter runs only in processes started with "
                                "TRITON_INTERPRET=1 (tests/conftest.py sets it without a GPU)")),
])
def cpu_backend(request, monkeypatch):
    from ember.backend.options import OPTIONS
    spec = OPTIONS["cpu_backend"]
    monkeypatch.setitem(OPTIONS, "cpu_backend",
                        dataclasses.replace(spec, default=request.param))
    return request.param


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import sys
    util = sys.modules.get("opinfo_util")
    if util is None or not any(util.RESULTS.values()):
        return
    lines = [util.summary_line(t) for t, results in util.RESULTS.items() if results]
    path = os.environ.get("EMBER_OPINFO_REPORT")
    if path:
        util.write_report(path)
        lines[-1] += f" (report: {path})"
    print("\n".join(lines))
