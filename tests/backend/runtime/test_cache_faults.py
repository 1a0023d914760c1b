"""Faults of Ember's on-disk cache (ember/backend/runtime/disk_cache.py and its users): damaged
entries (truncated, garbage, a flipped byte, deleted), an unusable or untrusted directory, a
full or read-only disk, a writer killed mid-write, processes and threads sharing one
directory, cold and warm runs of every cached program shape, the size limit, and the
boolean environment switches. Each fault must end in a correct result: the entry rebuilt,
or the process compiling without the cache (warned once), never a crash or an OSError."""
from __future__ import annotations

import concurrent.futures
import ctypes
import errno
import gc
import json
import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import ember
from ember import config
from ember.backend.targets.cpp import build
from ember.backend.runtime import disk_cache, graph_cache
from test_graph_cache import Net   # the graph cache tests' model (a constant tensor, a softmax)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../.."))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory, the graph cache on, and this process's view of caches
    forgotten (which directories it found unusable, whether it warned)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(root))
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "1")
    monkeypatch.setattr(disk_cache, "_unusable", {})
    monkeypatch.setattr(disk_cache, "_checked", set())
    monkeypatch.setattr(disk_cache, "_damaged_warned", False)
    monkeypatch.setattr(disk_cache, "_scanned_roots", set())
    ember.reset()
    return root


def _warnings(log) -> list[str]:
    """The distinct warnings (ember_log's caplog sees each record through two handlers)."""
    return sorted({r.getMessage() for r in log.records if r.levelno >= logging.WARNING})


def _run(model, x, cpu_backend="cpp"):
    ember.reset()
    with torch.no_grad():
        got = ember.compile(model, options={"cpu_backend": cpu_backend})(x)
        torch.testing.assert_close(got, model(x))
    return got


def _python(script: str, env: dict, args=(), **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": REPO, **env}
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out[-3000:]}"
    return out


# -- 1. damaged entries: checked before use, deleted, built again ----------------------------

def _damage(path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(os.urandom(len(data)))
    elif how == "flipped":            # still a loadable library: only the checksum tells
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x40]) + data[i + 1:])
    elif how == "deleted":
        path.unlink()


_SOURCES = {how: f'extern "C" long answer_{how}() {{ return {i + 40}; }}\n'
            for i, how in enumerate(("truncated", "empty", "garbage", "flipped", "deleted"))}


def test_damaged_kernel_libraries_are_rebuilt(cache, ember_log):
    """Another process built the libraries (so this one has none loaded: glibc would hand
    back an already loaded library without reading the file); each is then damaged. Before
    the seal check, a truncated library failed with "file too short" (or SIGBUS) in every
    later process, and a flipped byte ran corrupted code."""
    _finish(_python("from ember.backend.targets.cpp import build\n"
                    f"for s in {list(_SOURCES.values())!r}:"
                    f"\n    build.compile_cpp(s)", {}))
    for how, source in _SOURCES.items():
        so, _, _ = build._so_path(source, ())
        _damage(so, how)
    build.build_stats.reset()
    for how, source in _SOURCES.items():
        fn = build.load_cpp(source)[f"answer_{how}"]
        fn.restype = ctypes.c_long
        assert fn() == 40 + list(_SOURCES).index(how)
    assert build.build_stats.compiled == len(_SOURCES)
    warned = _warnings(ember_log)
    assert len(warned) == 1 and "damaged cache entry" in warned[0], warned  # the first only


@pytest.mark.parametrize("how", ["truncated", "garbage", "flipped"])
def test_damaged_graph_entries_are_compiled_again(cache, ember_log, how):
    model, x = Net().eval(), torch.randn(4, 8)
    _run(model, x)
    (entry,) = (cache / "graphs").rglob("*.graph")
    _damage(entry, how)
    _run(model, x)
    assert any("damaged cache entry" in w for w in _warnings(ember_log))
    assert graph_cache.load(entry.stem) is not None      # stored again, whole


def _rewrite_header(entry, change) -> None:
    """Change the JSON header of a graph entry and seal it again (a consistent entry)."""
    blob = disk_cache.unseal(entry.read_bytes())
    head = 16 + int.from_bytes(blob[8:16], "little")
    header = json.loads(blob[16:head])
    change(header)
    text = json.dumps(header).encode()
    entry.write_bytes(disk_cache.seal(blob[:8] + len(text).to_bytes(8, "little") + text +
                                      blob[head:]))


def test_a_whole_entry_that_does_not_load_is_compiled_again(cache, ember_log):
    """Whole (its seal matches) but its wrapper does not run: deleted and compiled again."""
    model, x = Net().eval(), torch.randn(4, 8)
    _run(model, x)
    (entry,) = (cache / "graphs").rglob("*.graph")
    _rewrite_header(entry, lambda h: h.update(wrapper="def call(args):\n    return (\n"))
    _run(model, x)
    assert any("damaged cache entry" in w and "SyntaxError" in w for w in _warnings(ember_log))
    assert graph_cache.load(entry.stem) is not None


def test_an_entry_naming_code_outside_torch_is_refused(cache, ember_log):
    """Entries hold no pickles: the objects a wrapper names are resolved by name, from
    torch, ember and the standard library's operator/math only."""
    model, x = Net().eval(), torch.randn(4, 8)
    _run(model, x)
    (entry,) = (cache / "graphs").rglob("*.graph")
    blob = disk_cache.unseal(entry.read_bytes())
    assert b"\x80\x04" not in blob[:16] and not blob.startswith(b"PK")   # no pickle, no zip

    def name_os_system(header):
        header["consts"][next(iter(header["consts"]))] = {"callable": ["os", "system"]}
    _rewrite_header(entry, name_os_system)
    assert graph_cache.load(entry.stem) is None and not entry.exists()
    assert any("not in torch, ember" in w for w in _warnings(ember_log))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton interpreter")
def test_a_damaged_triton_module_is_replaced(cache, ember_log, monkeypatch):
    model, x = Net().eval(), torch.randn(4, 8)
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "0")
    _run(model, x, "triton")
    (module,) = (cache / "triton").rglob("*.py")
    module.write_text("import os\nraise SystemExit('not the generated module')\n")
    from ember.backend.targets.triton.compile_workers import triton_module_name
    sys.modules.pop(triton_module_name(module.stem), None)
    _run(model, x, "triton")
    assert any("does not hash to its name" in w for w in _warnings(ember_log))
    assert "SystemExit" not in module.read_text()


def test_damaged_kernel_choices_are_dropped(cache, ember_log):
    from ember.backend.targets.triton import launch
    path = cache / "autotune" / "k.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"XBLOCK": 6')                       # truncated
    assert launch._read_json(path) is None and not path.exists()
    assert not launch._is_key_index({"a": "../../../etc"})    # keys name Triton cache folders
    assert launch._is_key_index({"a": "c0ffee_12"})


# -- 2. cold and warm processes: every cached program shape ----------------------------------

_PROGRAMS = textwrap.dedent(r'''
    import sys, torch, ember
    from ember import logs
    logs.set_logs("output_code")
    torch.manual_seed(0)

    def constant(x):
        return x == torch.tensor([1., float("inf"), 2.])

    def mutated(x, y):
        x.add_(y)
        return (y * 2).sum()

    def outputs(x):
        return x.sin(), x.cos() + 1, x.sum(0)

    def aliases(x):
        y = x * 2
        return x.t(), y, y[1:], y.view(-1)

    linear = torch.nn.Linear(3, 3)

    def parameters(x):
        return torch.relu(linear(x)) * 0.5

    def inputs():
        return {"constant": [torch.tensor([1., float("inf"), 3.])],
                "mutated": [torch.randn(3), torch.randn(3)],
                "outputs": [torch.randn(4, 3)], "aliases": [torch.randn(2, 3)],
                "parameters": [torch.randn(2, 3)]}

    bad = 0
    for frontend in sys.argv[1].split(","):
        for fn in (constant, mutated, outputs, aliases, parameters):
            torch.manual_seed(1)
            args = inputs()[fn.__name__]
            want_args = [a.clone() for a in args]
            with torch.no_grad():
                want = fn(*want_args)
                compiled = torch.compile(fn, backend="ember") if frontend == "torch" \
                    else ember.compile(fn)
                got = compiled(*args)
            same = all(torch.equal(g, w) or torch.allclose(g, w) for g, w in
                       zip(torch.utils._pytree.tree_leaves(got),
                           torch.utils._pytree.tree_leaves(want)))
            same = same and all(torch.equal(a, b) for a, b in zip(args, want_args))
            print(frontend, fn.__name__, "ok" if same else "DIFFERS", flush=True)
            bad += not same
    sys.exit(bad)
''')


def test_cold_then_warm_processes_share_one_cache(cache):
    """Two processes compile the same programs into one empty directory at once, then a
    third loads them all. Before the fix, the warm run of ``constant`` through
    torch.compile died with SIGSEGV: the constant came back from torch.load as a meta tensor
    (torch.compile's tracing context made torch.load fake), and its kernel read address 0."""
    env = {"EMBER_CACHE_DIR": str(cache), "EMBER_GRAPH_CACHE": "1"}
    cold = [_python(_PROGRAMS, env, ["torch,ember"]) for _ in range(2)]
    for proc in cold:
        assert _finish(proc).count(" ok") == 10
    proc = subprocess.run([sys.executable, "-c", _PROGRAMS, "torch,ember"],
                          env={**os.environ, "PYTHONPATH": REPO, **env}, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.count(" ok") == 10, proc.stdout
    # the programs' graphs were loaded, not compiled
    assert proc.stderr.count("graph cache hit") >= 8, proc.stderr[-3000:]


# -- 3. an untrusted directory is not used ------------------------------------------------------

def test_a_new_cache_directory_is_private(cache):
    _run(Net().eval(), torch.randn(4, 8))
    assert (cache.stat().st_mode & 0o777) == 0o700


@pytest.mark.parametrize("fault", ["group-writable", "foreign-owner"])
def test_an_untrusted_directory_is_not_used(cache, ember_log, fault):
    cache.mkdir(mode=0o700)
    if fault == "group-writable":
        os.chmod(cache, 0o775)
    else:
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(cache, 12345, 12345)
    _run(Net().eval(), torch.randn(4, 8))
    warned = _warnings(ember_log)
    assert len(warned) == 1 and "EMBER_CACHE_DIR" in warned[0], warned
    assert not list(cache.iterdir())                # nothing read or written there


# -- 4. cache I/O failures: compile without the cache, warned once ----------------------------

@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_an_unusable_cache_path_compiles_without_the_cache(tmp_path, cache, ember_log,
                                                           monkeypatch, where):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(blocker if where == "a file"
                                              else blocker / "ember"))
    model = Net().eval()
    _run(model, torch.randn(4, 8))
    _run(model, torch.randn(5, 8))
    warned = _warnings(ember_log)
    assert len(warned) == 1 and "EMBER_CACHE_DIR" in warned[0] and "\n" not in warned[0]


@pytest.mark.parametrize("code, part", [(errno.ENOSPC, "cpp"), (errno.ENOSPC, "graphs"),
                                        (errno.EROFS, "")])
def test_a_failing_disk_compiles_without_the_cache(cache, ember_log, monkeypatch, code, part):
    """``os.replace`` into the cache (every store ends with one) fails as on a full disk or a
    read-only file system; before, the OSError reached the user's first call."""
    real = os.replace
    target = str(cache / part)

    def failing(src, dst, *a, **k):
        if str(dst).startswith(target):
            raise OSError(code, os.strerror(code), str(dst))
        return real(src, dst, *a, **k)
    monkeypatch.setattr(os, "replace", failing)
    model = Net().eval()
    _run(model, torch.randn(4, 8))
    _run(model, torch.randn(6, 8))
    warned = _warnings(ember_log)
    assert len(warned) == 1 and "EMBER_CACHE_DIR" in warned[0], warned
    assert os.strerror(code) in warned[0]


# -- 5. bounded memory and disk ---------------------------------------------------------------

def test_compile_and_reset_cycles_keep_memory_bounded(cache, monkeypatch):
    """ember.reset() forgets generated sources (Ember's, and torch.fx's of the graphs it
    made), and kernel libraries no graph uses are unloaded: none grows with the number of
    compile + reset cycles."""
    from torch.fx import graph_module

    from ember import api
    from ember.backend import compile as backend_compile
    model, x = Net().eval(), torch.randn(4, 8)
    counts = []
    monkeypatch.setattr(api, "_PRUNE_AFTER", 1)
    gc.collect()
    # libraries that graphs compiled by earlier tests still hold (torch's own frontend keeps
    # its compiled graphs until torch._dynamo.reset()) are not this test's
    held_before = build.loaded_count()
    for _ in range(8):
        _run(model, x)
        ember.reset()
        gc.collect()
        counts.append((len(backend_compile.generated_sources), build.loaded_count(),
                       len(graph_module._loader.eval_cache)))
    assert counts[-1] == counts[2] and counts[-1][0] == 0, counts
    assert counts[-1][1] <= held_before + 1, (held_before, counts)


def test_a_library_is_unloaded_when_no_kernel_uses_it(cache):
    """A kernel function keeps its library loaded; once none is left it is dlclosed (its
    mapping leaves the process). Counted from what earlier tests left loaded (a compiled
    graph another test still holds keeps its own library)."""
    gc.collect()
    before = build.loaded_count()
    fn = build.kernel_function(build.load_cpp('extern "C" long seven() { return 7; }\n'),
                               "seven", 0)
    fn.restype = ctypes.c_long
    gc.collect()
    assert fn() == 7 and build.loaded_count() == before + 1

    def mapped():
        with open("/proc/self/maps") as f:
            return [line for line in f if str(cache) in line]
    assert mapped()
    del fn
    gc.collect()
    assert build.loaded_count() == before and not mapped()


def test_generated_sources_are_capped(cache):
    from ember.backend import compile as backend_compile
    backend_compile.generated_sources.extend(["x"] * 5000)
    _run(Net().eval(), torch.randn(4, 8))
    assert len(backend_compile.generated_sources) <= 1000


def test_least_recently_used_entries_are_evicted(cache):
    folder = cache / "cpp" / "ab"
    folder.mkdir(parents=True)
    now = time.time()
    for i in range(8):                       # 8 entries of 256 KB, used 8..1 hours ago
        for suffix in (".so", ".cpp"):
            path = folder / f"entry{i}{suffix}"
            path.write_bytes(b"x" * (128 << 10))
            os.utime(path, (now, now - 3600 * (8 - i)))
    disk_cache.touch(folder / "entry0.so")    # used just now: kept
    stale = folder / "entry9.so.123.tmp"      # a killed writer's
    stale.write_bytes(b"x")
    os.utime(stale, (now - 7200, now - 7200))
    freed = disk_cache.evict(cache, 1 << 20)
    left = sorted(p.name for p in folder.iterdir())
    assert freed == 5 * (256 << 10)           # down to 80% of 1 MB: 3 entries
    assert left == ["entry0.cpp", "entry0.so", "entry6.cpp", "entry6.so", "entry7.cpp",
                    "entry7.so"]


def test_cache_size_option():
    with config.patch(cache_size_mb=3):
        assert disk_cache.limit_bytes() == 3 << 20
    with pytest.raises(ValueError, match="cache_size_mb"):
        config.cache_size_mb = 0
    proc = subprocess.run([sys.executable, "-c", "import ember.config"], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": REPO, "EMBER_CACHE_SIZE_MB": "-1"},
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "EMBER_CACHE_SIZE_MB" in proc.stderr


# -- 6. boolean switches are parsed one way -----------------------------------------------------

@pytest.mark.parametrize("value, on", [("0", False), ("false", False), ("OFF", False),
                                       ("no", False), ("1", True), ("True", True),
                                       ("on", True), ("YES", True)])
def test_graph_cache_switch_values(monkeypatch, value, on):
    monkeypatch.setenv("EMBER_GRAPH_CACHE", value)
    assert graph_cache.enabled() is on


def test_a_switch_value_not_understood_names_the_variable(monkeypatch):
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "maybe")
    with pytest.raises(ValueError, match="EMBER_GRAPH_CACHE='maybe'"):
        graph_cache.enabled()
    with pytest.raises(ValueError, match="EMBER_SUPPRESS_ERRORS='sometimes'"):
        config.parse_bool("EMBER_SUPPRESS_ERRORS", "sometimes")


def test_graph_cache_off_stores_nothing(cache, monkeypatch):
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "off")
    _run(Net().eval(), torch.randn(4, 8))
    assert not list(cache.rglob("*.graph"))


# -- 7. writers killed mid-write, concurrent threads -------------------------------------------

_KILLED_WRITER = textwrap.dedent('''
    import os, signal, sys
    from ember.backend.runtime import disk_cache
    class Dying:
        def __init__(self, f): self.f = f
        def __enter__(self): return self
        def __exit__(self, *a): return False
        def write(self, data):
            self.f.write(data[:len(data) // 2]); self.f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    real_fdopen = os.fdopen
    if sys.argv[1] == "mid-write":
        os.fdopen = lambda fd, mode: Dying(real_fdopen(fd, mode))
    else:
        os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
    disk_cache.atomic_write(disk_cache.root() / "graphs" / sys.argv[2] / "abc.graph",
                            disk_cache.seal(b"x" * 100000))
''')


def test_a_writer_killed_mid_write_leaves_no_entry(cache):
    """Killed while writing its temporary file, or just before renaming it into place."""
    whens = {"mid-write": "ab", "before-rename": "cd"}
    procs = [_python(_KILLED_WRITER, {"EMBER_CACHE_DIR": str(cache)}, [when, folder])
             for when, folder in whens.items()]
    for proc in procs:
        proc.communicate(timeout=60)
        assert proc.returncode == -9
    for folder in whens.values():
        folder = cache / "graphs" / folder
        assert not (folder / "abc.graph").exists()
        (tmp,) = folder.iterdir()                  # the killed writer's temporary file
        assert ".tmp" in tmp.name
        os.utime(tmp, (time.time() - 7200,) * 2)
    assert graph_cache.load("abc") is None and graph_cache.load("cdc") is None
    disk_cache.evict(cache, 1 << 30)
    assert not [p for p in cache.rglob("*") if p.is_file()]   # old ones: cleaned up


def test_threads_share_one_cache(cache):
    """Threads build the same libraries and store and load the same graph entry at once:
    each sees a whole entry or none."""
    sources = [f'extern "C" long v() {{ return {i}; }}\n' for i in range(3)]
    model, x = Net().eval(), torch.randn(4, 8)
    _run(model, x)
    (entry,) = (cache / "graphs").rglob("*.graph")
    artifact = graph_cache.load(entry.stem)

    def work(i):
        libs = build.compile_many(sources)
        graph_cache.store(entry.stem, artifact)
        got = graph_cache.load(entry.stem)
        assert got is not None and got.wrapper == artifact.wrapper
        values = []
        for lib in libs:
            fn = lib["v"]
            fn.restype = ctypes.c_long
            values.append(fn())
        return values
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(work, range(8)))
    assert results == [[0, 1, 2]] * 8
    assert not [p for p in cache.rglob("*") if ".tmp" in p.name]
