"""Session summary of the OpInfo conformance suites (``test_opinfo.py``: C++ kernels,
``test_opinfo_triton.py``: Triton kernels under the interpreter), one line per target run."""
from __future__ import annotations

import os


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
