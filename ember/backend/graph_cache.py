"""On-disk cache of compiled graphs: a new process skips tracing, lowering and codegen.

A graph's compiled form is its wrapper (generated Python), the objects the wrapper names
(dtypes, devices, ATen ops...), the ATen graph's constant tensors, and its kernels: their
sources and what the target needs to load them (``KernelRecord``). Kernels themselves are
cached by their targets (C++ libraries by source hash, Triton in Triton's cache), so a hit
only loads them.

The key hashes everything the result depends on: the captured graph's code, each input's
type, shape, strides, dtype, device and ``requires_grad``, the backend options and
``ember.config`` settings that reach the backend, the versions of torch and Triton, the GPU's
name, and the source of Ember's backend packages (any change to the compiler invalidates
every entry). Graphs that call anything but torch, ``operator`` or builtin functions, or
that hold constant tensors of their own, are not cached: their code does not say what they
compute. ``EMBER_GRAPH_CACHE=0`` turns the cache off.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import os
import pathlib
import pickle
from typing import Any

import torch

from ember import config, logs

# the packages whose code decides what a graph compiles to
_COMPILER_PACKAGES = ("aot", "backend", "decomp")
_CACHED_CONFIG = ("layout_optimization", "fallback_on_lowering_error", "half_fast_math",
                  "kept_buffers_mb", "matmul_padding")
_VERSION = 1


@dataclasses.dataclass
class KernelRecord:
    """What a target needs to load one compiled kernel again (see ``Target.build``)."""
    name: str
    source: str
    args: list
    dtypes: dict
    stored: set
    grid: Any = None
    config: dict | None = None
    candidates: list | None = None
    numel_x: int = 0
    uses_indirect: bool = False
    matmul_spec: dict | None = None     # a matmul with its epilogue (triton_matmul.py)

    @classmethod
    def of(cls, kernel) -> "KernelRecord":
        return cls(kernel.name, kernel.source, list(kernel.args), dict(kernel.dtypes),
                   set(getattr(kernel, "stored", ())), getattr(kernel, "grid", None),
                   getattr(kernel, "config", None), getattr(kernel, "candidates", None),
                   getattr(kernel, "numel_x", 0), getattr(kernel, "uses_indirect", False),
                   getattr(kernel, "matmul_spec", None))


@dataclasses.dataclass
class CompiledArtifact:
    wrapper: str
    consts: dict
    constants: dict            # the ATen graph's constant tensors
    kernels: list[KernelRecord]
    mutates_inputs: bool


def enabled() -> bool:
    return os.environ.get("EMBER_GRAPH_CACHE", "1") != "0"


def key(gm: torch.fx.GraphModule, example_inputs: list, options: dict,
        device: torch.device) -> str | None:
    """The cache key of compiling ``gm`` for these inputs, or None: not cacheable."""
    parts = [f"v{_VERSION}", _compiler_hash(), torch.__version__, _triton_version(),
             gm.code, repr(sorted(options.items())),
             repr([(name, getattr(config, name)) for name in _CACHED_CONFIG])]
    if device.type == "cuda":
        parts.append(torch.cuda.get_device_name(device))
    # the ATen trace bakes in the casts of an autocast region the graph is compiled inside
    parts.append(repr([(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                       for d in ("cpu", "cuda")]))
    for node in gm.graph.nodes:
        if node.op == "get_attr" or node.op == "call_module":
            return None
        if node.op == "call_function" and not _named_by_code(node.target):
            return None
    for value in example_inputs:
        if isinstance(value, torch.Tensor):
            parts.append(f"{type(value).__name__} {tuple(value.shape)} {value.stride()} "
                         f"{value.dtype} {value.device} {value.requires_grad} "
                         f"{value.storage_offset()}")
        else:
            parts.append(f"{type(value).__name__} {value!r}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _named_by_code(target) -> bool:
    """``target`` is one the graph's code names unambiguously (torch, operator, builtins)."""
    module = getattr(target, "__module__", None) or ""
    return module.split(".")[0] in ("torch", "_operator", "operator", "builtins", "math") or \
        isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))


@functools.lru_cache(maxsize=1)
def _compiler_hash() -> str:
    root = pathlib.Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for package in _COMPILER_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def _triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except ImportError:
        return "no triton"


def _path(cache_key: str) -> pathlib.Path:
    from ember.backend.build import cache_dir
    return cache_dir() / "graphs" / cache_key[:2] / f"{cache_key}.pt"


# -- what the wrapper names: plain objects pickle; ATen ops by name -------------------------

# torch.save's pickler refuses memory formats (plain pickle takes them): saved by name
_MEMORY_FORMATS = {str(f).removeprefix("torch."): f for f in (
    torch.contiguous_format, torch.channels_last, torch.channels_last_3d, torch.preserve_format)}


def _encode(obj):
    if isinstance(obj, torch._ops.OpOverload):
        return ("op", obj._schema.name, obj._overloadname)
    if isinstance(obj, torch.memory_format):
        return ("memory_format", str(obj).removeprefix("torch."))
    return ("value", obj)


def _decode(entry):
    kind = entry[0]
    if kind == "op":
        namespace, name = entry[1].split("::")
        return getattr(getattr(getattr(torch.ops, namespace), name), entry[2])
    if kind == "memory_format":
        return _MEMORY_FORMATS[entry[1]]
    return entry[1]


def store(cache_key: str, artifact: CompiledArtifact) -> None:
    from ember.backend.build import atomic_write
    try:
        buf = io.BytesIO()
        torch.save({"wrapper": artifact.wrapper,
                    "consts": {k: _encode(v) for k, v in artifact.consts.items()},
                    "constants": artifact.constants,
                    "kernels": [dataclasses.asdict(k) for k in artifact.kernels],
                    "mutates_inputs": artifact.mutates_inputs}, buf)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        logs.log("perf_hints", "graph cache: not stored (%s: %s)", type(e).__name__, e)
        return
    path = _path(cache_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buf.getvalue())


def load(cache_key: str) -> CompiledArtifact | None:
    path = _path(cache_key)
    if not path.exists():
        return None
    try:
        data = torch.load(path, weights_only=False)
        return CompiledArtifact(
            data["wrapper"], {k: _decode(v) for k, v in data["consts"].items()},
            data["constants"], [KernelRecord(**k) for k in data["kernels"]],
            data["mutates_inputs"])
    except Exception as e:     # a damaged or foreign entry: compile again, and say so
        logs.warn("graph cache: entry %s unreadable (%s: %s); compiling", path.name,
                  type(e).__name__, e)
        return None
