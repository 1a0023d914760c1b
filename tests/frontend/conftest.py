"""The frontend's tests, one folder per concept:

- ``conformance/``: the conformance suite, small programs compared with eager with the
  number of graphs asserted (``test_conformance_*.py``), and its helper
  ``conformance_util.py`` (``check``);
- ``graph_breaks/``: frames split into graphs around what cannot be captured, and the
  resume functions;
- ``python_semantics/``: Python's object model during capture: attribute lookup and
  shadowing, the object protocol, Python state, type introspection;
- ``nn_modules/``: modules changed after compiling, parameter generators, lazy modules;
- ``model_libraries/``: idioms of timm, transformers and torchvision, and the survey over
  their models (``survey_models.py``, a script);
- ``capture_scope/``: what is captured at all: supported Pythons, CUDA devices, the trace
  rules that skip a callable, the calls of a frame that runs eagerly;
- ``bytecode/``: disassembly, assembly and analysis of bytecode (they run without torch).

Helpers are imported as top-level modules (``from conformance_util import check``), found
because pytest's default ("prepend") import mode puts each test file's own folder on
``sys.path``; ``conformance/`` is added here, for ``conformance_util`` serves the other
folders too.
"""
from __future__ import annotations

import os
import sys

CONFORMANCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conformance")
if CONFORMANCE not in sys.path:
    sys.path.insert(0, CONFORMANCE)
