"""Ember's on-disk cache directory: where it is, whether it is safe to use, how its entries are
written, checked, and evicted.

Where
    ``$EMBER_CACHE_DIR`` or ``~/.cache/ember`` (read at each call). Below it: ``cpp/`` (C++
    kernel libraries and their sources), ``graphs/`` (compiled graphs), ``triton/``
    (generated Triton modules), ``autotune/`` (max_autotune choices), ``eager_choice/``
    (whether a graph runs compiled or eagerly, ``eager_choice.py``), ``fake/`` (a helper
    library of ``ember.fake``).

Trust
    Everything in the directory is executed (libraries are ``dlopen``-ed, Triton modules
    imported, graph wrappers ``exec``-ed), so, as ssh and gpg do with their directories, the
    directory is used only when it is owned by the current user and not writable by group
    or others; Ember creates it with mode 0700. Otherwise (and when it cannot be created,
    is a file, is read-only, or a write in it fails: a full disk) Ember warns once, in one
    line naming ``EMBER_CACHE_DIR``, and compiles without the cache for the rest of the
    process: kernels are then built in a private temporary directory (a C++ library must be
    a file to be loaded), removed at exit, and compiled graphs are not stored.

Integrity
    Entries are written to a temporary file in their folder and renamed into place (atomic
    within a file system): a reader sees no entry or a whole one, also when the writer is
    killed; a damaged entry is never rewritten in place either (a process that has a library
    mapped would die of SIGBUS), it is unlinked and written anew. Binary entries are
    *sealed*: a 48-byte trailer with a magic, the payload's length and its sha256 follows
    the payload (an ELF loader ignores bytes after the file's last section, so a sealed
    library is still a library). Before an entry is used its seal is checked; a damaged
    entry (truncated, overwritten, garbage: a disk error, an interrupted copy) is warned
    about (the first one in a process; later ones under ``EMBER_LOGS=perf_hints``),
    deleted, and built again. No fsync: a power cut may leave an empty or partial file, which
    the seal check turns into a rebuild.

Size
    ``config.cache_size_mb`` (``EMBER_CACHE_SIZE_MB``, default 2048) bounds the directory.
    Each use of an entry sets its modification time (``touch``): that is the access time
    Ember records (the file system's atime is often off or coarse). After the first entry
    a process stores, and after each further eighth of the limit it writes, the directory
    is scanned; past the limit, the least recently used entries (a library and its source
    count as one) are deleted until it is at 80% of the limit. Temporary files older than
    an hour (a killed writer's) are deleted by the same scan.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import pathlib
import shutil
import stat
import struct
import tempfile
import threading
import time

from ember import config, logs

ENV = "EMBER_CACHE_DIR"
_lock = threading.RLock()
_unusable: dict[str, str] = {}       # cache root -> why this process does not use it
_checked: set[str] = set()           # cache roots found usable by this process
_scratch: pathlib.Path | None = None
_damaged_warned = False


class DamagedEntry(Exception):
    """A cache entry that is not what was stored (truncated, overwritten, garbage)."""


# -- the directory ----------------------------------------------------------------------------

def configured_root() -> str:
    return os.environ.get(ENV) or os.path.join(os.path.expanduser("~"), ".cache", "ember")


def root() -> pathlib.Path | None:
    """The cache directory, checked (created 0700 when missing); None when this process
    does not use it (the reason was warned once)."""
    path = configured_root()
    if path in _checked:
        return pathlib.Path(path)
    if path in _unusable:
        return None
    with _lock:
        if path not in _checked and path not in _unusable:
            reason = _check(path)
            if reason is None:
                _checked.add(path)
            else:
                _set_unusable(path, reason)
    return pathlib.Path(path) if path in _checked else None


def _check(path: str) -> str | None:
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError as e:
        return f"it cannot be created ({_describe(e)})"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"it is writable by group or others (mode {st.st_mode & 0o777:o}; chmod 700 it)"
    return None


def _describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}" + (f": {e.filename}" if e.filename else "")
    return f"{type(e).__name__}: {e}"


def _set_unusable(path: str, reason: str) -> None:
    with _lock:
        if path in _unusable:
            return
        _checked.discard(path)
        _unusable[path] = reason
    logs.warn("ember: not using the cache directory %s (%s=%s): %s; compiling without the "
              "cache in this process", path, ENV, os.environ.get(ENV, "<unset>"), reason)


def failed(error: BaseException, doing: str) -> None:
    """A cache I/O failure (``doing``: what failed): this process stops using the cache
    directory (warned once) and compiles without it."""
    _set_unusable(configured_root(), f"{doing} failed ({_describe(error)})")


def cache_dir() -> pathlib.Path:
    """Where kernels are built: the cache directory, or (when it is not used) this process's
    private scratch directory."""
    return root() or scratch_dir()


def scratch_dir() -> pathlib.Path:
    """A private (0700) temporary directory of this process, removed at exit."""
    global _scratch
    with _lock:
        if _scratch is None:
            base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
                else None
            try:
                _scratch = pathlib.Path(tempfile.mkdtemp(prefix="ember-nocache-", dir=base))
            except OSError:
                _scratch = pathlib.Path(tempfile.mkdtemp(prefix="ember-nocache-"))
            atexit.register(shutil.rmtree, str(_scratch), True)
    return _scratch


def in_cache(path: pathlib.Path) -> bool:
    """``path`` lies in the (used) cache directory, not in the scratch directory."""
    return _scratch is None or _scratch not in pathlib.Path(path).parents


# -- writing ----------------------------------------------------------------------------------

def makedirs(folder: pathlib.Path) -> None:
    os.makedirs(folder, mode=0o700, exist_ok=True)


def atomic_write(path: pathlib.Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed into place: a reader never
    sees a partial file. Raises OSError (the caller decides whether that disables the cache)."""
    path = pathlib.Path(path)
    makedirs(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        unlink(tmp)
        raise
    stored(len(data))


def unlink(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# -- small JSON entries (choices: autotune configs, eager or compiled) -----------------------

def read_json(path, valid=None):
    """The JSON value kept at ``path``; None when there is none, or it is damaged (not
    JSON, or ``valid(value)`` is false: it is read from disk, so untrusted), then deleted
    and said (``discard``)."""
    try:
        text = pathlib.Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        discard(path, e)
        return None
    try:
        value = json.loads(text)
    except ValueError as e:       # truncated, garbage
        discard(path, e)
        return None
    if valid is not None and not valid(value):
        discard(path, "not a valid entry")
        return None
    touch(path)
    return value


def write_json(path, value, doing: str) -> None:
    """Keep ``value`` at ``path`` (``atomic_write``); a failure to write in the cache
    directory turns the cache off (warned once, naming ``doing``)."""
    try:
        atomic_write(pathlib.Path(path), json.dumps(value))
    except OSError as e:
        if in_cache(pathlib.Path(path)):
            failed(e, doing)


# -- sealed entries: payload + magic, length, sha256 --------------------------------------------

_MAGIC = b"EMBSEAL1"
_TRAILER = struct.Struct("<8sQ32s")


def seal(payload: bytes) -> bytes:
    return payload + _TRAILER.pack(_MAGIC, len(payload), hashlib.sha256(payload).digest())


def unseal(blob: bytes) -> bytes:
    """The payload of a sealed entry; DamagedEntry when the seal does not match."""
    if len(blob) < _TRAILER.size:
        raise DamagedEntry(f"{len(blob)} bytes, shorter than its seal")
    magic, length, digest = _TRAILER.unpack_from(blob, len(blob) - _TRAILER.size)
    if magic != _MAGIC:
        raise DamagedEntry("no seal at its end (truncated or overwritten)")
    if length != len(blob) - _TRAILER.size:
        raise DamagedEntry(f"{len(blob) - _TRAILER.size} bytes where {length} were stored")
    payload = blob[:length]
    if hashlib.sha256(payload).digest() != digest:
        raise DamagedEntry("its checksum does not match its content")
    return payload


def seal_file(path) -> None:
    """Append the seal to a file not yet renamed into place (a compiled library)."""
    with open(path, "r+b") as f:
        payload = f.read()
        f.write(_TRAILER.pack(_MAGIC, len(payload), hashlib.sha256(payload).digest()))


def check_sealed_file(path) -> None:
    """Raise DamagedEntry unless the file at ``path`` is whole (FileNotFoundError: gone)."""
    with open(path, "rb") as f:
        unseal(f.read())


def discard(path, reason) -> None:
    """A damaged entry: said (the first in this process as a warning), deleted."""
    global _damaged_warned
    unlink(path)
    with _lock:
        first, _damaged_warned = not _damaged_warned, True
    text = reason if isinstance(reason, str) else f"{type(reason).__name__}: {reason}"
    if first:
        logs.warn("ember: damaged cache entry %s (%s): deleted, compiling it again (later "
                  "ones: EMBER_LOGS=perf_hints)", path, text)
    else:
        logs.log("perf_hints", "damaged cache entry %s (%s): deleted, compiling it again",
                 path, text)


def touch(path) -> None:
    """Record a use of the entry at ``path`` (its modification time: see Size above)."""
    try:
        os.utime(path)
    except OSError:
        pass


# -- size limit -------------------------------------------------------------------------------

_written_since_scan = 0
_scanned_roots: set[str] = set()
_STALE_TMP_SECONDS = 3600


def limit_bytes() -> int:
    mb = config.cache_size_mb
    if mb <= 0:
        raise ValueError(f"config.cache_size_mb (EMBER_CACHE_SIZE_MB) is {mb}: expected a "
                         "positive number of megabytes")
    return mb << 20


def stored(nbytes: int) -> None:
    """``nbytes`` were written to the cache: evict when due (see Size above)."""
    global _written_since_scan
    top = root()
    if top is None:
        return
    with _lock:
        _written_since_scan += nbytes
        due = str(top) not in _scanned_roots or _written_since_scan > limit_bytes() // 8
        if due:
            _scanned_roots.add(str(top))
            _written_since_scan = 0
    if due:
        evict(top, limit_bytes())


def _entry_name(name: str) -> str:
    """Files of one entry share the name up to the first dot (``<key>.so``, ``<key>.cpp``)."""
    return name.split(".", 1)[0]


def evict(top: pathlib.Path, limit: int) -> int:
    """Delete the least recently used entries below ``top`` until it holds at most 80% of
    ``limit`` bytes (when it holds more than ``limit``); returns the bytes deleted."""
    entries: dict[tuple[str, str], list] = {}     # (folder, entry name) -> [bytes, used, paths]
    total = 0
    now = time.time()
    for folder, _, files in os.walk(top):
        for name in files:
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if ".tmp" in name:           # a writer's, or a killed writer's
                if now - st.st_mtime > _STALE_TMP_SECONDS:
                    unlink(path)
                continue
            entry = entries.setdefault((folder, _entry_name(name)), [0, 0.0, []])
            entry[0] += st.st_size
            entry[1] = max(entry[1], st.st_mtime)
            entry[2].append(path)
            total += st.st_size
    if total <= limit:
        return 0
    freed = 0
    for size, _, paths in sorted(entries.values(), key=lambda e: e[1]):
        if total - freed <= limit * 0.8:
            break
        for path in paths:
            unlink(path)
        freed += size
    logs.log("perf_hints", "cache %s: %d MB over its limit of %d MB: deleted %d MB of the "
             "least recently used entries", top, (total - limit) >> 20, limit >> 20,
             freed >> 20)
    return freed

