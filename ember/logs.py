"""Named log artifacts and per-frame debug dumps.

``EMBER_LOGS=graph,guards,recompiles,graph_breaks,bytecode`` turns on those artifacts (``aot``:
a training graph's joint graph, its forward/backward partition and the saved bytes;
``compile_time``: the seconds each backend stage took, per graph; ``ddp``: where a graph
captured for DistributedDataParallel was cut at its gradient buckets, and why); each is a
child logger of ``ember`` (``ember.graph``...) printed through :mod:`logging` at INFO level.
``EMBER_LOGS=all`` turns on every artifact. ``EMBER_DEBUG_DIR=path`` writes, for each compiled
frame, one folder with the stage outputs as files a user can open.
"""
from __future__ import annotations

import itertools
import logging
import os
import re
from pathlib import Path

from ember import config

ARTIFACTS = ("graph", "guards", "recompiles", "graph_breaks", "bytecode", "output_code",
             "perf_hints", "aot", "compile_time", "ddp")

_root = logging.getLogger("ember")
_enabled: set[str] = set()


def _configure(spec: str) -> None:
    names = {s.strip() for s in spec.split(",") if s.strip()}
    if "all" in names:
        names = set(ARTIFACTS)
    unknown = names - set(ARTIFACTS)
    if unknown:
        raise ValueError(f"EMBER_LOGS names unknown artifacts {sorted(unknown)}; "
                         f"known: {', '.join(ARTIFACTS)}, all")
    _enabled.clear()
    _enabled.update(names)
    if names and not _root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        _root.addHandler(handler)
        _root.propagate = False
    for name in ARTIFACTS:
        logging.getLogger(f"ember.{name}").setLevel(
            logging.INFO if name in names else logging.WARNING)


def set_logs(spec: str) -> None:
    """Programmatic twin of ``EMBER_LOGS``: ``ember.logs.set_logs("graph,guards")``."""
    _configure(spec)


def enabled(artifact: str) -> bool:
    return artifact in _enabled


def log(artifact: str, msg: str, *args) -> None:
    """Print ``msg`` under ``artifact`` if that artifact is on (lazy formatting)."""
    if artifact in _enabled:
        logging.getLogger(f"ember.{artifact}").info(msg, *args)


def warn(msg: str, *args) -> None:
    """Always shown: something the user should know (e.g. a frame fell back to eager)."""
    _root.warning(msg, *args)


def debug_reason(msg: str, *args) -> None:
    """Why the compiler decided something; shown with the graph_breaks artifact."""
    log("graph_breaks", msg, *args)


_frame_counter = itertools.count()


def debug_frame_dir(frame_name: str) -> Path | None:
    """A fresh folder for one compiled frame's dumps, or None when EMBER_DEBUG_DIR is unset."""
    root = config.debug_dir
    if not root:
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", frame_name)[:80]
    path = Path(root) / f"{next(_frame_counter):04d}_{safe}_{os.getpid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def dump(folder: Path | None, filename: str, text: str) -> None:
    if folder is not None:
        (folder / filename).write_text(text)


_configure(os.environ.get("EMBER_LOGS", ""))
