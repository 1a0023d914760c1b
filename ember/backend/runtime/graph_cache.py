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
compute. ``EMBER_GRAPH_CACHE=0`` (or false/no/off) turns the cache off.

Entry format
    No pickle: loading an entry must not run code it names. An entry is one sealed file
    (``disk_cache.seal``: its length and sha256 are checked before anything is read) holding
    a JSON header and the raw bytes of the constant tensors' storages. The header has the
    wrapper's source, the kernels' records and the wrapper's objects in a tagged JSON form
    (dtypes, devices, ATen ops and torch functions by name, resolved on load through
    ``torch``/``ember`` attributes only); a graph naming anything else is not stored.
    Constants are rebuilt from their bytes with ``set_`` (dtype, size, stride, storage
    offset as stored), not with ``torch.load``: under ``torch.compile`` the backend runs
    inside a tracing context whose fake mode makes ``torch.load`` return storage-less meta
    tensors, and the kernels then read address 0 (SIGSEGV on a warm cache only).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import math
import pathlib
import struct
from typing import TYPE_CHECKING, Any

import torch

from ember import config, logs
from ember.backend.runtime import disk_cache

if TYPE_CHECKING:
    from ember.backend.targets import Target

# the packages whose code decides what a graph compiles to
_COMPILER_PACKAGES = ("aot", "backend", "decomp")
_CACHED_CONFIG = ("layout_optimization", "fallback_on_lowering_error", "half_fast_math",
                  "kept_buffers_mb", "matmul_padding", "profile_kernels")
_VERSION = 2
_MAGIC = b"EMBGRPH2"


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
    exports_flags: bool = False         # a C++ kernel with <name>_flags (targets/cpp/kernel.py)
    matmul_spec: dict | None = None     # a matmul with its epilogue (targets/triton/matmul.py)
    size_args: list = dataclasses.field(default_factory=list)   # size symbols it takes

    @classmethod
    def of(cls, kernel) -> "KernelRecord":
        return cls(kernel.name, kernel.source, list(kernel.args), dict(kernel.dtypes),
                   set(getattr(kernel, "stored", ())), getattr(kernel, "grid", None),
                   getattr(kernel, "config", None), getattr(kernel, "candidates", None),
                   getattr(kernel, "numel_x", 0), getattr(kernel, "exports_flags", False),
                   getattr(kernel, "matmul_spec", None), list(getattr(kernel, "size_args", ())))


@dataclasses.dataclass
class CompiledArtifact:
    wrapper: str
    consts: dict
    constants: dict            # the ATen graph's constant tensors
    kernels: list[KernelRecord]
    mutates_inputs: bool
    guards: str = ""           # a graph with symbolic sizes: its guards (backend/symbolic.py)


def enabled() -> bool:
    """``EMBER_GRAPH_CACHE`` (a boolean, read at each compile; default on)."""
    return config.env_flag("EMBER_GRAPH_CACHE", True)


def key(gm: torch.fx.GraphModule, example_inputs: list, options: dict,
        target: Target) -> str | None:
    """The cache key of compiling ``gm`` for these inputs with ``target``, or None: not
    cacheable."""
    parts = [f"v{_VERSION}", _compiler_hash(), torch.__version__, _triton_version(),
             gm.code, repr(sorted(options.items())),
             repr([(name, getattr(config, name)) for name in _CACHED_CONFIG])]
    identity = target.cache_identity()      # a GPU's model
    if identity is not None:
        parts.append(identity)
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
    root = pathlib.Path(__file__).resolve().parents[2]     # ember/, above backend/runtime/
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


def _path(root: pathlib.Path, cache_key: str) -> pathlib.Path:
    return root / "graphs" / cache_key[:2] / f"{cache_key}.graph"


# -- tagged JSON: the values a wrapper and its kernels' records name ----------------------

class Unstorable(TypeError):
    """A value the entry format does not hold (the graph is then not stored)."""


_MEMORY_FORMATS = {str(f).removeprefix("torch."): f for f in (
    torch.contiguous_format, torch.channels_last, torch.channels_last_3d, torch.preserve_format)}
_LAYOUTS = {str(f).removeprefix("torch."): f for f in (torch.strided, torch.sparse_coo)}
_CALLABLE_ROOTS = ("torch", "ember", "operator", "_operator", "math", "builtins")


def _resolve(module: str, qualname: str):
    if module.split(".")[0] not in _CALLABLE_ROOTS:
        raise Unstorable(f"{module}.{qualname} is not in torch, ember or the standard library")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _callable_name(obj) -> list[str]:
    """``[module, qualname]`` that resolves back to ``obj`` itself."""
    names = [(getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)),
             ("torch", getattr(obj, "__name__", None))]      # torch.mm: a method of a C class
    for module, qualname in names:
        if module and qualname:
            try:
                if _resolve(module, qualname) is obj:
                    return [module, qualname]
            except (Unstorable, ImportError, AttributeError):
                pass
    raise Unstorable(f"{obj!r} cannot be named")


def _encode(obj):
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return {"float": repr(obj)} if not math.isfinite(obj) else obj
    if isinstance(obj, list):
        return {"list": [_encode(v) for v in obj]}
    if isinstance(obj, torch.Size):
        return {"size": [int(v) for v in obj]}
    if isinstance(obj, tuple):
        return {"tuple": [_encode(v) for v in obj]}
    if isinstance(obj, (set, frozenset)):
        return {"set": [_encode(v) for v in sorted(obj, key=repr)]}
    if isinstance(obj, dict):
        return {"dict": [[_encode(k), _encode(v)] for k, v in obj.items()]}
    if isinstance(obj, torch.dtype):
        return {"dtype": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.device):
        return {"device": str(obj)}
    if isinstance(obj, torch.memory_format):
        return {"memory_format": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.layout):
        return {"layout": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch._ops.OpOverload):
        return {"op": [obj._schema.name, obj._overloadname]}
    if isinstance(obj, torch._ops.OpOverloadPacket):
        return {"op_packet": obj._qualified_op_name}
    if callable(obj):
        return {"callable": _callable_name(obj)}
    raise Unstorable(f"a {type(obj).__name__} value")


def _decode(obj):
    if not isinstance(obj, dict):
        if obj is None or isinstance(obj, (bool, int, str, float)):
            return obj
        raise ValueError(f"unexpected {type(obj).__name__} in an entry")
    (tag, value), = obj.items()
    if tag == "float":
        return float(value)
    if tag == "list":
        return [_decode(v) for v in value]
    if tag == "size":
        return torch.Size(value)
    if tag == "tuple":
        return tuple(_decode(v) for v in value)
    if tag == "set":
        return {_decode(v) for v in value}
    if tag == "dict":
        return {_decode(k): _decode(v) for k, v in value}
    if tag == "dtype":
        dtype = getattr(torch, value)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{value!r} is not a dtype")
        return dtype
    if tag == "device":
        return torch.device(value)
    if tag == "memory_format":
        return _MEMORY_FORMATS[value]
    if tag == "layout":
        return _LAYOUTS[value]
    if tag == "op":
        namespace, name = value[0].split("::")
        return getattr(getattr(getattr(torch.ops, namespace), name), value[1] or "default")
    if tag == "op_packet":
        namespace, name = value.split("::")
        return getattr(getattr(torch.ops, namespace), name)
    if tag == "callable":
        return _resolve(*value)
    raise ValueError(f"unknown tag {tag!r} in an entry")


# -- constant tensors as raw storage bytes --------------------------------------------------

def _tensor_record(tensor: torch.Tensor, start: int) -> tuple[dict, bytes]:
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or \
            tensor.layout != torch.strided or tensor.is_quantized or tensor.is_conj() or \
            tensor.is_neg() or tensor.device.type not in ("cpu", "cuda"):
        raise Unstorable(f"a constant {type(tensor).__name__} of layout {tensor.layout}")
    storage = tensor.untyped_storage()
    raw = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
    data = raw.cpu().numpy().tobytes()
    return {"dtype": _encode(tensor.dtype), "size": list(tensor.shape),
            "stride": list(tensor.stride()), "offset": tensor.storage_offset(),
            "device": str(tensor.device), "requires_grad": tensor.requires_grad,
            "start": start, "nbytes": len(data)}, data


def _tensor_from(record: dict, blob: memoryview) -> torch.Tensor:
    start, nbytes = record["start"], record["nbytes"]
    if start < 0 or start + nbytes > len(blob):
        raise ValueError("a constant's bytes lie outside the entry")
    raw = torch.frombuffer(bytearray(blob[start:start + nbytes]), dtype=torch.uint8) \
        if nbytes else torch.empty(0, dtype=torch.uint8)
    device = torch.device(record["device"])
    raw = raw.to(device)
    tensor = torch.empty(0, dtype=_decode(record["dtype"]), device=device).set_(
        raw.untyped_storage(), record["offset"], record["size"], record["stride"])
    return tensor.requires_grad_(bool(record["requires_grad"]))


def _serialize(cache_key: str, artifact: CompiledArtifact) -> bytes:
    records, chunks, start = {}, [], 0
    for name, tensor in artifact.constants.items():
        if not isinstance(tensor, torch.Tensor):
            raise Unstorable(f"a constant {type(tensor).__name__}")
        records[name], data = _tensor_record(tensor, start)
        chunks.append(data)
        start += len(data)
    header = json.dumps({
        "version": _VERSION, "key": cache_key, "wrapper": artifact.wrapper,
        "consts": {k: _encode(v) for k, v in artifact.consts.items()},
        "constants": records,
        "kernels": [_encode(dataclasses.asdict(k)) for k in artifact.kernels],
        "mutates_inputs": artifact.mutates_inputs, "guards": artifact.guards},
        allow_nan=False).encode()
    return disk_cache.seal(_MAGIC + struct.pack("<Q", len(header)) + header + b"".join(chunks))


def _deserialize(cache_key: str, blob: bytes) -> CompiledArtifact:
    payload = disk_cache.unseal(blob)
    if payload[:8] != _MAGIC:
        raise disk_cache.DamagedEntry("not a graph entry")
    (length,) = struct.unpack_from("<Q", payload, 8)
    header = json.loads(payload[16:16 + length])
    if header.get("version") != _VERSION or header.get("key") != cache_key:
        raise disk_cache.DamagedEntry("stored under another key or version")
    data = memoryview(payload)[16 + length:]
    kernels = []
    for record in header["kernels"]:
        fields = _decode(record)
        if not isinstance(fields, dict) or not isinstance(fields.get("source"), str):
            raise ValueError("a malformed kernel record")
        kernels.append(KernelRecord(**fields))
    if not isinstance(header["wrapper"], str):
        raise ValueError("a malformed wrapper")
    return CompiledArtifact(
        header["wrapper"], {k: _decode(v) for k, v in header["consts"].items()},
        {k: _tensor_from(r, data) for k, r in header["constants"].items()}, kernels,
        bool(header["mutates_inputs"]), str(header.get("guards", "")))


def store(cache_key: str, artifact: CompiledArtifact) -> None:
    """Keep ``artifact`` under ``cache_key`` (nothing when the cache is off in this process,
    or the graph names what the entry format does not hold)."""
    root = disk_cache.root()
    if root is None:
        return
    try:
        blob = _serialize(cache_key, artifact)
    except Unstorable as e:
        logs.log("perf_hints", "graph cache: not stored (it holds %s)", e)
        return
    try:
        disk_cache.atomic_write(_path(root, cache_key), blob)
    except OSError as e:
        disk_cache.failed(e, "storing a compiled graph")


def discard(cache_key: str, reason) -> None:
    """The entry under ``cache_key`` loaded but does not work: deleted (and said)."""
    root = disk_cache.root()
    if root is not None:
        disk_cache.discard(_path(root, cache_key), reason)


def load(cache_key: str) -> CompiledArtifact | None:
    """The artifact stored under ``cache_key``, or None: none, or a damaged one (deleted)."""
    root = disk_cache.root()
    if root is None:
        return None
    path = _path(root, cache_key)
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        disk_cache.failed(e, "reading a compiled graph")
        return None
    try:
        artifact = _deserialize(cache_key, blob)
    except Exception as e:     # noqa: BLE001 (damaged, or written by another Ember: compile)
        disk_cache.discard(path, e)
        return None
    disk_cache.touch(path)
    return artifact
