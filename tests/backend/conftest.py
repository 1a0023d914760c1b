"""Session summary of the OpInfo conformance suite (``test_opinfo.py``)."""
from __future__ import annotations

import os


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import sys
    util = sys.modules.get("opinfo_util")
    if util is None or not util.RESULTS:
        return
    line = util.summary_line()
    path = os.environ.get("EMBER_OPINFO_REPORT")
    if path:
        util.write_report(path)
        line += f" (report: {path})"
    print(line)
