"""Imported once by ``ember bench``'s forkserver (``runner.IsolatedRunner``) before it forks
the per-row children, so each child starts with these modules loaded.

Always torch and Ember's harness; then what ``EMBER_BENCH_PRELOAD`` (a comma list the runner
sets) names: ``timm``, ``transformers``, ``torchvision`` (through ``compat``, which defines
torchvision's operator schemas first) and ``inductor`` (torch.compile's modules: about 10 s
of imports that would otherwise count in every row's torch.compile time). A preload that fails
is skipped here; the row that needs it reports the error.
"""
import os

import ember.bench.harness  # noqa: F401
from ember.bench import compat


def _inductor() -> None:
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401


_PRELOADERS = {"timm": compat.import_timm, "transformers": compat.import_transformers,
               "torchvision": compat.import_torchvision, "inductor": _inductor}

for _name in filter(None, os.environ.get("EMBER_BENCH_PRELOAD", "").split(",")):
    try:
        _PRELOADERS[_name]()
    except Exception:   # noqa: BLE001  the row that needs it reports the error
        pass
