"""Optional model libraries (timm, transformers) for the benchmark and the model tests.

Both are optional: ``import_timm()`` / ``import_transformers()`` return the module, or None
when it is not installed, so callers can skip models instead of failing.

torchvision's PyPI wheel ships a C extension built against a different torch; beside torch
2.13 its ``_C`` library does not load, so the ``torchvision::nms``/``qnms`` operators are never
defined and ``import torchvision`` dies registering fake kernels for them ("operator
torchvision::nms does not exist"). timm imports torchvision, so before importing it we define
the two schemas (the text of torchvision's own C++ ``m.def``) when nothing defined them. Only
the schemas are defined, no kernel: calling nms would fail, and no benchmark model does.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import types

import torch

# Never reach the network: models are built from configs with random weights.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_TORCHVISION_SCHEMAS = {
    "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
# torch.library drops the definitions when its Library object is collected: keep it alive.
_torchvision_lib: torch.library.Library | None = None


def _operator_exists(namespace: str, name: str) -> bool:
    return bool(torch._C._jit_get_schemas_for_operator(f"{namespace}::{name}"))


def _load_torchvision_extension() -> bool:
    """Load torchvision's own C extension if it matches this torch (it then defines the
    operators itself, and defining them here too would abort the process)."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return False
    import glob
    for folder in spec.submodule_search_locations:
        for lib in glob.glob(os.path.join(folder, "_C*.so")):
            try:
                torch.ops.load_library(lib)
                return True
            except (OSError, RuntimeError):
                return False
    return False


def define_torchvision_schemas() -> None:
    """Define torchvision's nms/qnms operator schemas unless its extension already did."""
    global _torchvision_lib
    if all(_operator_exists("torchvision", n) for n in _TORCHVISION_SCHEMAS):
        return
    if _load_torchvision_extension() and all(
            _operator_exists("torchvision", n) for n in _TORCHVISION_SCHEMAS):
        return
    missing = {name: schema for name, schema in _TORCHVISION_SCHEMAS.items()
               if not _operator_exists("torchvision", name)}
    if not missing:
        return
    if _torchvision_lib is None:
        # FRAGMENT, not DEF: torchvision's own Library("torchvision", "DEF") may come later
        # (if its extension loads), and there can be only one DEF library per namespace.
        _torchvision_lib = torch.library.Library("torchvision", "FRAGMENT")
    for name, schema in missing.items():
        _torchvision_lib.define(name + schema)


def _import_optional(name: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def import_torchvision() -> types.ModuleType | None:
    if importlib.util.find_spec("torchvision") is None:
        return None
    define_torchvision_schemas()
    return _import_optional("torchvision")


def import_timm() -> types.ModuleType | None:
    """timm, or None when it (or torchvision, which it imports) is not installed."""
    if importlib.util.find_spec("timm") is None:
        return None
    import_torchvision()
    return _import_optional("timm")


def import_transformers() -> types.ModuleType | None:
    """transformers, or None when it is not installed."""
    if importlib.util.find_spec("transformers") is None:
        return None
    import_torchvision()   # transformers imports torchvision too when it is installed
    return _import_optional("transformers")
