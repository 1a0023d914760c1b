"""Worker processes that compile generated Triton kernels into Triton's on-disk cache.

Triton's compiler holds the GIL for much of its work, so threads compile one kernel at a
time; separate processes compile in parallel. Each worker is ``python -m
ember.backend.compile_workers`` (not ``multiprocessing``, whose spawned children re-run the
user's ``__main__`` script when it has no ``if __name__ == "__main__"`` guard). The protocol
on the worker's stdin/stdout is length-prefixed pickles: a task ``(module path, kernel name,
argument dtypes, grid, config, device)`` in, ``None`` or an error message out. The worker
redirects its own stdout to stderr, so nothing Triton prints can corrupt the protocol.

A worker compiles by calling the kernel's ``warmup`` on one-element CUDA tensors, as the
parent would: the parent's own compile of the same kernel is then a cache hit.
"""
from __future__ import annotations

import os
import pickle
import queue
import struct
import subprocess
import sys
import threading


class CompileWorkers:
    """A fixed set of worker processes, started at once, importing torch and Triton while the
    parent goes on."""

    def __init__(self, count: int):
        import ember
        root = os.path.dirname(os.path.dirname(os.path.abspath(ember.__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [root, env.get("PYTHONPATH")] if p)
        self.procs = [subprocess.Popen([sys.executable, "-m", "ember.backend.compile_workers"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
                      for _ in range(count)]
        self.lock = threading.Lock()     # one batch at a time

    def run(self, tasks: list[tuple]) -> list[str]:
        """Compile every task; returns the error messages (empty when all compiled)."""
        pending: queue.SimpleQueue = queue.SimpleQueue()
        for task in tasks:
            pending.put(task)
        errors: list[str] = []

        def serve(proc):
            while True:
                try:
                    task = pending.get_nowait()
                except queue.Empty:
                    return
                try:
                    _send(proc.stdin, task)
                    reply = _receive(proc.stdout)
                except (OSError, EOFError, struct.error) as e:
                    errors.append(f"worker {proc.pid} died ({type(e).__name__})")
                    return
                if reply is not None:
                    errors.append(reply)

        with self.lock:
            threads = [threading.Thread(target=serve, args=(p,), daemon=True)
                       for p in self.procs if p.poll() is None]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if not pending.empty():
            errors.append("no live worker for some kernels")
        return errors

    def close(self) -> None:
        for proc in self.procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()


def _send(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def _receive(stream):
    head = stream.read(4)
    if len(head) < 4:
        raise EOFError
    (n,) = struct.unpack("<I", head)
    return pickle.loads(stream.read(n))


def compile_task(path: str, name: str, dtypes: list, grid: tuple, config: dict,
                 device: int, modules: dict) -> None:
    """Compile kernel ``name`` of the generated module at ``path`` into Triton's cache."""
    import importlib.util

    import torch
    module = modules.get(path)
    if module is None:
        spec = importlib.util.spec_from_file_location(
            "ember_worker_" + os.path.basename(path)[:-3], path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules[path] = module
    args = [torch.empty(1, dtype=d, device=f"cuda:{device}") for d in dtypes]
    getattr(module, name).warmup(*args, grid=grid, **config)


_triton_key_lock = threading.Lock()


def warm_up_triton(cuda: bool = False) -> None:
    """Pay Triton's once-per-process costs now, while the parent traces: the hash of its own
    sources that keys its cache (about a second), and with ``cuda`` the CUDA context. A
    failure here is met again, and reported, by the first real compile. Once per process:
    threads that ask while another computes it wait (Triton's ``lru_cache`` would let each
    of them compute it again)."""
    try:
        from triton.runtime.cache import triton_key
        with _triton_key_lock:
            triton_key()
        import torch
        if cuda and torch.cuda.is_available():
            torch.empty(1, device="cuda")
    except (ImportError, AttributeError, RuntimeError):
        pass


def _main() -> None:
    reply = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                      # prints go to stderr, not into the protocol
    import torch  # noqa: F401        (the slow imports, before the first task arrives)
    import triton  # noqa: F401
    warm_up_triton(cuda=True)
    tasks = sys.stdin.buffer
    modules: dict = {}
    while True:
        try:
            task = _receive(tasks)
        except EOFError:
            return
        try:
            compile_task(*task, modules)
            _send(reply, None)
        except Exception as e:
            _send(reply, f"{task[1]}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


if __name__ == "__main__":
    _main()
