"""Generated Triton modules, imported from files in the kernel cache (Triton reads a
kernel's source through ``inspect``, so it must live in a file)."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys


def load_triton_module(source: str, interpret: bool):
    """Import generated Triton source from the kernel cache (Triton reads a kernel's source
    through ``inspect``, so it must live in a file). Returns the module and whether its
    source is new to the cache (its kernels were never compiled on this machine)."""
    if interpret:
        _enter_interpreter()
    from ember.backend.runtime import disk_cache
    from ember.backend.targets.triton.compile_workers import triton_module_name
    key = hashlib.sha256(source.encode()).hexdigest()
    name = triton_module_name(key)
    if name in sys.modules:
        return sys.modules[name], False
    path, fresh = _module_file(disk_cache.cache_dir(), key, source)
    if path is None:       # the cache could not be written: off for this process (warned)
        path, fresh = _module_file(disk_cache.scratch_dir(), key, source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # the checked source runs, not what the file holds by now (Triton's JIT reads the file
    # for each kernel's source, which this source is the content of)
    exec(compile(source, str(path), "exec"), module.__dict__)
    sys.modules[name] = module
    return module, fresh


def _module_file(root, key: str, source: str):
    """``(path, fresh)`` of the module file of ``source`` (named by its sha256 ``key``) below
    ``root``, written when missing; a file whose content does not hash to its name (damaged)
    is replaced. ``(None, True)`` when writing the cache failed."""
    from ember.backend.runtime import disk_cache
    path = root / "triton" / key[:2] / f"{key}.py"
    try:
        stored = path.read_bytes()
    except FileNotFoundError:
        stored = None
    except OSError as e:
        stored = e
    if stored is not None and (isinstance(stored, OSError) or
                               hashlib.sha256(stored).hexdigest() != key):
        disk_cache.discard(path, stored if isinstance(stored, OSError) else
                           "its content does not hash to its name")
        stored = None
    if stored is not None:
        disk_cache.touch(path)
        return path, False
    try:
        disk_cache.atomic_write(path, source.encode())
    except OSError as e:
        if not disk_cache.in_cache(path):
            raise
        disk_cache.failed(e, "storing a Triton module")
        return None, True
    return path, True


def _enter_interpreter() -> None:
    """Triton's interpreter must be chosen before Triton is imported: its own library
    functions (``tl.sum``...) are decorated then. Set ``TRITON_INTERPRET=1`` now if Triton
    is not imported yet; it stays set for the process."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    if "triton" in sys.modules:
        raise RuntimeError(
            "cpu_backend='triton' runs kernels under Triton's interpreter, which must be "
            "enabled before triton is imported: set TRITON_INTERPRET=1 in the environment")
    os.environ["TRITON_INTERPRET"] = "1"
