"""Fake tensors: metadata-only tensors that report the device a real tensor would have.

While Ember's frontend symbolically evaluates a user's program it needs every tensor's size,
stride, dtype, device and requires_grad exactly as eager would produce them, without computing
anything, allocating real memory or mutating real inputs. A ``FakeTensor`` answers those
questions; an op on fakes runs only the op's *meta kernel*.

    mode = FakeTensorMode()
    with mode:
        x = mode.from_real(torch.randn(8, 3, 224, 224))    # or torch.randn(..., device="cuda")
        y = model(x)                                         # y: FakeTensor, y.shape as eager

Decisions
---------
* **Wrapper subclass + meta tensor.** A ``FakeTensor`` is a ``_make_wrapper_subclass`` tensor
  (no data) holding ``_meta``, a ``meta``-device tensor of identical geometry, and
  ``fake_device``. The wrapper carries the *real* device, so ``x.device``/``x.is_cuda`` and
  the dispatch keys composite ops see match eager, while ATen's meta kernels compute on
  ``_meta``. The wrapper sits below autograd like any tensor, so autograd comes for free:
  outputs get ``requires_grad``/``grad_fn`` when eager's would, and ``backward()`` runs on
  fakes. Ops running on fakes outside the mode are dispatched through the fake's own mode.
* **Geometry changes in place** (``t_``, ``unsqueeze_``, ``squeeze_``, ``resize_`` shrinking,
  ``set_``) are mirrored onto the wrapper by ``as_strided_`` below the Python key, which only
  rewrites the TensorImpl's sizes/strides. Growing past the wrapper's storage (``resize_`` to
  more elements, ``out=`` with an empty tensor) raises ``FakeUnsupported`` and leaves the fake
  unchanged.
* **Views share storage.** A view's ``_meta`` is the meta kernel's view of its base's
  ``_meta``. ``from_real`` keeps one meta storage per live real storage, so fakes of views of
  one real tensor share it too (compare ``_meta.untyped_storage()._cdata``).
* **Devices.** Output device = the common device of the tensor inputs; a 0-dim CPU tensor
  does not vote against another device (as in eager); two different devices otherwise raise
  ``RuntimeError`` "Expected all tensors to be on the same device", except for ops that mix
  devices legitimately (``copy_``, ``_to_copy``, indexing with CPU indices: first argument
  decides). An explicit ``device=`` (factories, ``.to('cuda')``, ``*_like``) wins; factories
  without one make CPU tensors (``torch.set_default_device`` injects ``device=`` above us).
  ``cuda`` without an index is ``cuda:0``. The mode occupies PyTorch's FAKE infra-mode slot
  (``_mode_key``): C++ then skips lazy CUDA initialisation for factory calls, and with
  ``_set_only_lift_cpu_tensors`` ``torch.tensor(..., device="cuda")`` needs no GPU.
* **CUDA device guard on CPU-only builds.** Autograd and ``.to('cuda')`` ask the CUDA device
  guard for streams/devices; a CPU-only build has none and autograd *aborts the process*. See
  ``_install_cuda_guard``: GPU builds without a device use ``_ensureCUDADeviceGuardSet``;
  CPU-only builds compile (once, ~2 s, cached under ``$EMBER_CACHE_DIR`` or ``~/.cache/ember``)
  a 10-line library registering c10's ``FakeGuardImpl<CUDA>``. Without g++ a warning is given
  and autograd through cuda fakes raises ``FakeUnsupported`` where it can be caught.
* **Identity for in-place and out= ops.** For ops whose schema marks a written alias, an output
  that *is* an input's ``_meta`` maps back to that input's ``FakeTensor``: ``x.add_(1) is x``,
  ``torch.add(a, b, out=c) is c``. A non-mutating op whose meta kernel hands back its input
  (a no-op ``_to_copy`` decomposition) gets a fresh tensor, as eager would.
* **Real tensors met during dispatch** (constants, buffers) go through ``from_real``, memoised
  per live real tensor (``WeakTensorKeyDictionary``). It keeps geometry, dtype, device,
  requires_grad and nn.Parameter-ness (``isinstance(fake, nn.Parameter)`` via Parameter's
  ``_is_param`` marker). The fake of a non-leaf is a leaf; ``.grad`` is not copied. Sparse,
  quantized, nested and other non-strided tensors, and subclasses with their own
  ``__torch_dispatch__``, raise ``FakeUnsupported`` naming the kind.
* **Data dependence.** Ops whose output size or Python result depends on values (``nonzero``,
  ``masked_select``, ``unique``, ``.item()``/``_local_scalar_dense``, ``equal``,
  ``is_nonzero``, ``x[mask]`` ...) raise ``DataDependentError(op)``; ``bool``/``int``/
  ``float``/``item``/``tolist``/``numpy`` on a fake raise it directly. ``x[mask] = v`` (bool
  ``index_put``) keeps ``x``'s geometry whatever the mask holds, so it is supported.
* **Errors.** No meta kernel (``NotImplementedError``) -> ``FakeUnsupported(op, error)``. Other
  errors a meta kernel raises (shape mismatch, bad dim) propagate unchanged: same exception
  type as eager, though the wording may differ (Python refs phrase broadcasting differently).
* **Backend-dependent metadata.** Meta kernels cannot see the backend, so ``FIXUPS``
  (``fake_fixups.py``) corrects the few answers that depend on it: convolution keeps
  channels_last like mkldnn/cudnn, CPU batch norm in eval returns empty save_mean/save_invstd,
  the running statistics batch norm updates keep their dtype (its meta kernel gave half ones
  float32), CPU ``roll`` and ``group_norm`` keep a channels-last input's layout; and torch's
  ``device_hint`` (which
  its Python meta kernels ask) answers the fake device, not "cuda", so CPU svd/fft/
  nonzero_static get the CPU kernels' output strides.
* **Symbolic sizes** (issue 31). ``FakeTensorMode(shape_env=env)`` with ``from_real(t,
  dynamic_dims={0}, source="L['x']")`` makes a fake whose chosen dims are ``env``'s symbols
  (``torch.SymInt`` over ``ember.shapes``' node), with strides inferred from them where
  ``t`` is dense in its stride order and symbols of their own otherwise
  (``ember.shapes.geometry``). Ops then run unchanged: meta kernels compute with SymInts
  under the Python dispatcher, and every decision they take on a size is a guard in
  ``env``. Here sizes are compared structurally, never with ``==`` (which would guard):
  the result cache keys a SymInt by its expression (one env per mode), in-place geometry
  changes compare expressions. Symbolic fakes of one real storage share a meta storage
  (``_symbolic_storage``: a view's storage size is a symbol); they share none with static
  fakes of it. The frontend makes them for its dynamic dims (``ember/frontend/
  symbolic_inputs.py``); the backend does not take them yet.
* **Randomness.** ``rand``/``randn``/``dropout``/``bernoulli`` run meta kernels: metadata
  only, no RNG state consumed, so capturing does not shift the user's random stream.
* **Python dispatcher.** Several meta kernels (view/reshape/expand, layer_norm) are Python
  registrations reached only under ``enable_python_dispatcher()``; entering the mode enables
  it. Nesting: re-entering the active mode is a no-op; entering another mode sets the current
  one aside until exit.
* **Speed.** Per op: one map over the arguments (``map_args``), a cached per-OpOverload
  classification (data-dependent / mixed-device / writes / fixup), output wrapping; results
  are cached by the arguments' geometry (``_results``), and eval batch norm's answer is
  computed in ``fake_fixups.py`` (``FAST_META``), not by torch's Python decomposition. Most of what remains
  is inside torch's Python meta kernels; the first of them imports ``torch._dynamo``
  (``torch._disable_dynamo`` wrappers), a second or more when nothing imported it before.
"""
from __future__ import annotations

import functools

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.weak import WeakTensorKeyDictionary

from ember.fake_fixups import DEVICE_HINT, FAST_META, FIXUPS

__all__ = ["FakeTensor", "FakeTensorMode", "DataDependentError", "FakeUnsupported", "is_fake",
           "is_symbolic"]

aten = torch.ops.aten
_META = torch.device("meta")
_CPU = torch.device("cpu")


class DataDependentError(RuntimeError):
    """An op's result (or its output size) depends on tensor values, which fakes don't have."""

    def __init__(self, op: str, msg: str | None = None):
        self.op = str(op)
        super().__init__(msg or f"{self.op}: output depends on tensor data, which fake tensors "
                                "do not have (data-dependent operation)")


class FakeUnsupported(RuntimeError):
    """Fake tensors cannot represent this tensor or run this op."""

    def __init__(self, what: str, error: BaseException | None = None):
        self.op = str(what)
        self.error = error
        super().__init__(f"fake tensors do not support {self.op}"
                         + (f": {type(error).__name__}: {error}" if error is not None else ""))


def is_fake(x) -> bool:
    return isinstance(x, FakeTensor)


def is_symbolic(x) -> bool:
    """A fake tensor some of whose sizes, strides or storage offset are symbolic."""
    return any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride(),
                                                      x.storage_offset()))


def _normalize_device(d) -> torch.device:
    if d is None:
        return _CPU
    if not isinstance(d, torch.device):
        d = torch.device(d)
    if d.type == "cuda" and d.index is None:
        return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return d


# ----------------------------------------------------------------------------------------------
# CUDA device guard for cuda-device fakes on machines without CUDA
#
# Autograd records a stream for every tensor it sees (InputMetadata) and ``Tensor.to("cuda")``
# asks the CUDA device guard for the current device. A CUDA build without GPUs gets PyTorch's
# no-op guard from ``torch._C._ensureCUDADeviceGuardSet()``; a CPU-only build has no CUDA
# guard at all and *aborts the process* (C++ terminate) when autograd meets a cuda tensor. So on
# CPU-only builds Ember compiles (once, ~2 s, cached) a 10-line library that registers c10's
# FakeGuardImpl<CUDA>. If that is impossible (no g++), ops that would make autograd record a
# cuda fake raise FakeUnsupported instead (a cuda *leaf* requiring grad can still abort).

_GUARD_SRC = r"""
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>
extern "C" int ember_install_cuda_guard() {
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
    static c10::impl::FakeGuardImpl<c10::DeviceType::CUDA> impl;
    static c10::impl::DeviceGuardImplRegistrar reg(c10::DeviceType::CUDA, &impl);
  }
  return c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA) ? 1 : 0;
}
"""
_cuda_guard_state: bool | None = None     # None: not tried yet


def _cuda_guard_ready() -> bool:
    global _cuda_guard_state
    if _cuda_guard_state is None:
        _cuda_guard_state = _install_cuda_guard()
    return _cuda_guard_state


def _install_cuda_guard() -> bool:
    if torch.cuda.is_available():
        return True
    if torch.version.cuda is not None or torch.version.hip is not None:
        torch._C._ensureCUDADeviceGuardSet()   # GPU build, no device: PyTorch's no-op guard
        return True
    import ctypes, hashlib, os, subprocess, tempfile, warnings
    tdir = os.path.dirname(torch.__file__)
    key = hashlib.sha256((_GUARD_SRC + torch.__version__ + tdir + "sealed").encode()
                         ).hexdigest()[:16]     # "sealed": the stored format (disk_cache.seal)
    from ember.backend.runtime import disk_cache    # checked directory; sealed (checked) library
    cache = str(disk_cache.cache_dir() / "fake")
    so = os.path.join(cache, f"cuda_guard_{key}.so")
    try:
        if not _sealed_whole(so):
            os.makedirs(cache, mode=0o700, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                src, out = os.path.join(tmp, "g.cpp"), os.path.join(tmp, "g.so")
                with open(src, "w") as fh:
                    fh.write(_GUARD_SRC)
                subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC",
                                f"-I{tdir}/include", src, f"-L{tdir}/lib", "-lc10", "-o", out],
                               check=True, capture_output=True, timeout=120)
                disk_cache.seal_file(out)
                os.replace(out, so)
        return bool(ctypes.CDLL(so).ember_install_cuda_guard())
    except Exception as e:                     # no compiler, read-only home, ...
        warnings.warn(f"ember.fake: cannot install a CUDA device guard on this CPU-only "
                      f"build ({e}); autograd on cuda fake tensors is unsupported here")
        return False


def _sealed_whole(path: str) -> bool:
    from ember.backend.runtime import disk_cache
    try:
        disk_cache.check_sealed_file(path)
        return True
    except FileNotFoundError:
        return False
    except (OSError, disk_cache.DamagedEntry) as e:
        disk_cache.discard(path, e)
        return False


def _check_cuda_autograd(func, fakes) -> None:
    if torch.is_grad_enabled() and any(f.requires_grad for f in fakes):
        raise FakeUnsupported(f"{func}: autograd on cuda fake tensors without a CUDA device "
                              "guard on this CPU-only build")


class FakeTensor(torch.Tensor):
    """A tensor with metadata only: ``_meta`` (meta device, same geometry) + ``fake_device``."""

    _meta: torch.Tensor
    fake_device: torch.device
    fake_mode: "FakeTensorMode"

    __slots__ = ()

    @staticmethod
    def __new__(cls, mode: "FakeTensorMode", meta: torch.Tensor, device: torch.device,
                requires_grad: bool = False):
        r = torch.Tensor._make_wrapper_subclass(
            cls, meta.size(), strides=meta.stride(), storage_offset=meta.storage_offset(),
            dtype=meta.dtype, device=device, requires_grad=requires_grad, layout=meta.layout,
            storage_size=meta.untyped_storage().nbytes())
        r._meta = meta
        r.fake_device = device
        r.fake_mode = mode
        return r

    # Tensor-level torch functions go straight to the dispatcher: outputs are already fakes.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # Reached only when an op runs on fakes with no FakeTensorMode active: use the mode
        # that made the first fake argument.
        mode = next(a.fake_mode for a in pytree.tree_leaves((args, kwargs))
                    if isinstance(a, FakeTensor))
        with enable_python_dispatcher():
            return mode._dispatch(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents=None):
        s = (f"FakeTensor(size={tuple(self.shape)}, dtype={self.dtype}, "
             f"device='{self.fake_device}'")
        if self.requires_grad:
            s += ", requires_grad=True"
        return s + ")"

    __str__ = __repr__

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        m = self._meta
        with _disable_current_modes(), torch.no_grad():
            meta = torch.empty_strided(m.size(), m.stride(), dtype=m.dtype, device=_META)
        new = FakeTensor(self.fake_mode, meta, self.fake_device, requires_grad=self.requires_grad)
        if getattr(self, "_is_param", False):
            new._is_param = True
        memo[id(self)] = new
        return new

    # Reading values is data-dependent.
    def item(self):
        raise DataDependentError("aten._local_scalar_dense")

    def tolist(self):
        raise DataDependentError("aten._local_scalar_dense", "tolist() on a fake tensor reads "
                                 "tensor data (data-dependent operation)")

    def numpy(self, *a, **k):
        raise DataDependentError("numpy", "numpy() on a fake tensor reads tensor data "
                                 "(data-dependent operation)")

    def __bool__(self):
        raise DataDependentError("aten.is_nonzero")

    def __int__(self):
        raise DataDependentError("aten._local_scalar_dense")

    def __float__(self):
        raise DataDependentError("aten._local_scalar_dense")

    def __complex__(self):
        raise DataDependentError("aten._local_scalar_dense")

    def __index__(self):
        raise DataDependentError("aten._local_scalar_dense")

    def __array__(self, *a, **k):
        raise DataDependentError("numpy", "converting a fake tensor to an array reads tensor data")


# ----------------------------------------------------------------------------------------------
# Op classification (cached per OpOverload)

_DATA_DEPENDENT = {
    "_local_scalar_dense", "item", "nonzero", "nonzero_numpy", "argwhere", "masked_select",
    "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive",
    "equal", "is_nonzero", "allclose", "bincount", "_assert_async", "_assert_scalar",
    "repeat_interleave", "histogram", "_nested_tensor_from_mask",
    "masked_scatter_backward", "segment_reduce", "sym_constrain_range",
}
_DATA_DEPENDENT_HINTS = ("data-dependent", "data dependent", "data-independent",
                         "_local_scalar_dense", "torch.nonzero", "aten::nonzero", "aten.nonzero")
# Ops whose inputs may legitimately live on different devices (eager allows these).
_MIXED_DEVICE_OK = {
    "copy_", "copy", "_copy_from", "_copy_from_and_resize", "_to_copy", "to", "lift_fresh",
    "lift_fresh_copy", "lift", "index", "_unsafe_index", "index_put", "index_put_",
    "_index_put_impl_", "_unsafe_index_put", "set_", "detach", "alias",
}
_KIND_PLAIN, _KIND_DATA, _KIND_MIXED = 0, 1, 2
# What torch's C++ answers where it cannot run an op on tensors with symbolic sizes
# (resize_ to static sizes; resize_as_, take_along_dim, cov: an assertion in its argument
# parser): never the user's error, so FakeUnsupported naming the op.
_SYMBOLIC_LIMITS = ("INTERNAL ASSERT FAILED", "directly modify sizes for customized tensor")




_BELOW_PYTHON = (torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
                 | torch._C.DispatchKeySet(torch._C.DispatchKey.PythonTLSSnapshot))


def _restride(fake: FakeTensor, meta: torch.Tensor) -> None:
    """Give the wrapper the geometry its meta tensor now has: ``as_strided_`` run below the
    Python key only rewrites the wrapper's TensorImpl sizes/strides (it owns no data)."""
    with torch._C._ExcludeDispatchKeyGuard(_BELOW_PYTHON), torch.no_grad():
        try:
            aten.as_strided_.default(fake, meta.size(), meta.stride(), meta.storage_offset())
        except RuntimeError as e:   # grows past the wrapper's (data-less) storage: undo on meta
            meta.set_(meta.untyped_storage(), fake.storage_offset(), fake.size(), fake.stride())
            raise FakeUnsupported("in-place growth of a fake tensor's storage (resize_, "
                                  "out= with a smaller tensor)", e) from e


_INDEX_PUT = {aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default,
              aten._unsafe_index_put.default}


def _has_mask_index(args) -> bool:
    idx = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in idx)


class _NonLeaf(torch.autograd.Function):
    """Identity whose output is a new fake over the same meta tensor: not a leaf, not a view
    (so in-place ops on it are allowed, as on the real tensor it stands for)."""

    @staticmethod
    def forward(ctx, leaf):
        return FakeTensor(leaf.fake_mode, leaf._meta, leaf.fake_device)

    @staticmethod
    def backward(ctx, grad):
        return grad


def _as_non_leaf(leaf: FakeTensor) -> FakeTensor:
    """The fake of a real tensor that requires grad and has a grad_fn (an intermediate
    passed across a graph break): a leaf fake would refuse in-place writes the real one
    takes (``y[0] = 0``), breaking the graph again."""
    with torch.enable_grad():
        return _NonLeaf.apply(leaf)


class FakeTensorMode(TorchDispatchMode):
    """Runs every ATen op on fakes' meta tensors and wraps the results as fakes.

    ``with FakeTensorMode() as mode: x = mode.from_real(t); y = model(x)``.
    """

    # Occupy PyTorch's infra slot for fake modes: C++ then skips lazy device initialisation
    # for factory calls such as ``torch.randn(3, device="cuda")`` (no CUDA needed).
    _mode_key = torch._C._TorchDispatchModeKey.FAKE

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps __torch_dispatch__ of modes in a TorchDynamo-skip shim that imports
        # torch._dynamo on first use (seconds); Ember never runs TorchDynamo
        return False

    def __init__(self, shape_env=None):
        super().__init__()
        # ember.shapes.ShapeEnv owning the symbols of symbolic fakes (see from_real)
        self.shape_env = shape_env
        self._memo = WeakTensorKeyDictionary()      # real tensor -> FakeTensor
        # real tensor -> {(dynamic dims, source): symbolic FakeTensor}
        self._symbolic_memo = WeakTensorKeyDictionary()
        self._symbolic_storages: dict[int, tuple] = {}   # as _storages, for symbolic fakes
        self._unnamed = 0                 # symbolic fakes made without a source: t0, t1, ...
        self._storages: dict[int, tuple] = {}       # real StorageImpl addr -> (weakref, meta storage)
        self._op_infos: dict = {}
        # (op, arguments' metadata) -> outputs' (size, stride, dtype): ops that make new
        # tensors from their inputs' geometry alone answer from here on a repeat (a model's
        # blocks repeat the same shapes), without running the meta kernel again
        self._results: dict = {}
        self._ctx_stack: list = []
        self._avoid_device_init = not torch.cuda.is_available()
        # the CUDA device guard (see above) is installed lazily, by the first op that makes
        # a cuda fake: CPU-only programs never pay for building it

    # -- entering ---------------------------------------------------------------------------
    def __enter__(self):
        # One mode occupies the FAKE slot at a time: re-entering the active mode is a no-op;
        # entering another one sets the current one aside until exit.
        prev = torch._C._unset_dispatch_mode(self._mode_key)
        if prev is self:
            torch._C._set_dispatch_mode(self)
            self._ctx_stack.append(None)
            return self
        pd = enable_python_dispatcher()
        pd.__enter__()
        prev_lift = None
        if self._avoid_device_init:
            prev_lift = torch._C._only_lift_cpu_tensors()
            torch._C._set_only_lift_cpu_tensors(True)
        self._ctx_stack.append((pd, prev_lift, prev))
        try:
            return super().__enter__()
        except BaseException:
            self._pop_ctx(None, None, None)
            raise

    def __exit__(self, exc_type, exc_val, exc_tb):
        if self._ctx_stack[-1] is None:
            self._ctx_stack.pop()
            return None
        try:
            return super().__exit__(exc_type, exc_val, exc_tb)
        finally:
            self._pop_ctx(exc_type, exc_val, exc_tb)

    def _pop_ctx(self, *exc):
        pd, prev_lift, prev = self._ctx_stack.pop()
        if prev_lift is not None:
            torch._C._set_only_lift_cpu_tensors(prev_lift)
        pd.__exit__(*exc)
        if prev is not None:
            torch._C._set_dispatch_mode(prev)

    # -- real -> fake -------------------------------------------------------------------------
    def from_real(self, t: torch.Tensor, *, dynamic_dims=None, source=None) -> FakeTensor:
        """The fake of real tensor ``t`` (memoised while ``t`` is alive).

        With ``dynamic_dims`` (dims of ``t``), those dims' sizes are symbols of the mode's
        ``shape_env`` (hints: ``t``'s sizes), strides and storage offset follow
        (``ember.shapes.geometry``); ``source`` names ``t`` in the env's guards (default
        ``"t0"``, ``"t1"``, ...). Symbolic fakes of one real storage share a meta storage (see
        ``_symbolic_storage``), but not with static fakes of it."""
        if isinstance(t, FakeTensor):
            return t
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"from_real expects a torch.Tensor, got {type(t).__name__}")
        if dynamic_dims is not None:
            # a mapping gives each dim's (min, max[, duck]) (``ember.mark_dynamic``; see
            # ember.shapes.geometry)
            bounds = dict(dynamic_dims) if isinstance(dynamic_dims, dict) else \
                {d: (None, None) for d in dynamic_dims}
            if any(not -t.dim() <= d < t.dim() for d in bounds):
                raise IndexError(f"dynamic dims {sorted(bounds)} out of range for a tensor of "
                                 f"{t.dim()} dims")
            bounds = {d % t.dim(): b for d, b in bounds.items()}
            return self._symbolic_from_real(t, frozenset(bounds.items()), source)
        fake = self._memo.get(t)
        if fake is not None:
            return fake
        self._check_supported(t)
        with _disable_current_modes(), torch._C.DisableTorchFunctionSubclass(), \
                torch.no_grad():
            meta = self._meta_like(t)
        fake = self._finish_fake(t, meta)
        self._memo[t] = fake
        return fake

    def _finish_fake(self, t: torch.Tensor, meta: torch.Tensor) -> FakeTensor:
        fake = FakeTensor(self, meta, t.device, requires_grad=t.requires_grad)
        if isinstance(t, torch.nn.Parameter):
            fake._is_param = True                 # isinstance(fake, nn.Parameter) -> True
        elif t.requires_grad and t.grad_fn is not None:
            fake = _as_non_leaf(fake)
        return fake

    def _symbolic_from_real(self, t: torch.Tensor, dims: frozenset, source) -> FakeTensor:
        env = self.shape_env
        if env is None:
            raise ValueError("from_real(dynamic_dims=...) needs a FakeTensorMode made with "
                             "shape_env=ember.shapes.ShapeEnv()")
        per_tensor = self._symbolic_memo.get(t)
        if per_tensor is None:
            per_tensor = self._symbolic_memo[t] = {}
        fake = per_tensor.get((dims, source))
        if fake is not None:
            return fake
        self._check_supported(t)
        key = (dims, source)
        if source is None:
            source = f"t{self._unnamed}"
            self._unnamed += 1
        from ember.shapes.geometry import symbolic_geometry    # sympy: only when needed
        bounds = dict(dims)
        sizes, strides, offset, extent = symbolic_geometry(
            env, t.shape, t.stride(), t.storage_offset(), bounds, source,
            bounds=bounds)
        wrap = env.wrap
        with _disable_current_modes(), torch._C.DisableTorchFunctionSubclass(), \
                torch.no_grad(), enable_python_dispatcher():
            storage = self._symbolic_storage(t, extent, source)
            meta = torch.empty(0, dtype=t.dtype, device=_META)
            meta.set_(storage, wrap(offset), [wrap(n) for n in sizes],
                      [wrap(n) for n in strides])
        fake = per_tensor[key] = self._finish_fake(t, meta)
        return fake

    def from_real_with_geometry(self, t: torch.Tensor, sizes, strides) -> FakeTensor:
        """A fake of real tensor ``t`` whose sizes and strides are the given sympy
        expressions over the mode's ``shape_env`` symbols (the backend's fakes of a graph
        whose symbolic sizes another frontend chose: ``ember.backend.symbolic``). The fake
        is all of a storage of its own, at offset 0: offsets count from ``t``'s data
        pointer, as the backend's kernels address their inputs (a view is seen as its own
        tensor; the caller rules out inputs that share memory)."""
        env = self.shape_env
        self._check_supported(t)
        extent = 0 if any(n == 0 for n in t.shape) else 1 + sum(
            ((n - 1) * s for n, s in zip(sizes, strides)), 0)
        wrap = env.wrap
        with _disable_current_modes(), torch._C.DisableTorchFunctionSubclass(), \
                torch.no_grad(), enable_python_dispatcher():
            storage = torch.empty(wrap(extent * t.element_size()), dtype=torch.uint8,
                                  device=_META).untyped_storage()
            meta = torch.empty(0, dtype=t.dtype, device=_META)
            meta.set_(storage, 0, [wrap(n) for n in sizes], [wrap(n) for n in strides])
        return self._finish_fake(t, meta)

    def _symbolic_storage(self, t: torch.Tensor, extent, source):
        """The meta storage of a symbolic fake, shared by the symbolic fakes of one real
        storage. A tensor that is all of its storage (not a view, storage as big as its
        extent) gets a storage of its extent's size; otherwise the storage's size is a
        symbol of its own (source ``<source>.untyped_storage().nbytes()``), so that views
        of one base at other sizes need no relation between their extents (each view's
        bounds check is then a guard ``extent <= nbytes``)."""
        from ember.shapes.geometry import TensorProperty
        env, real = self.shape_env, t.untyped_storage()
        key = real._cdata
        entry = self._symbolic_storages.get(key)
        if entry is not None and not entry[0].expired():
            return entry[1]
        hint_extent = 0 if t.numel() == 0 else 1 + t.storage_offset() + sum(
            (n - 1) * s for n, s in zip(t.shape, t.stride()))
        if t._base is None and real.nbytes() == hint_extent * t.element_size():
            nbytes = extent * t.element_size()
        else:
            nbytes = env.create_symbol(real.nbytes(), TensorProperty(source, "storage_nbytes"),
                                       duck=False)
        storage = torch.empty(env.wrap(nbytes), dtype=torch.uint8, device=_META
                              ).untyped_storage()
        if len(self._symbolic_storages) > 1024:
            self._symbolic_storages = {k: v for k, v in self._symbolic_storages.items()
                                       if not v[0].expired()}
        self._symbolic_storages[key] = (StorageWeakRef(real), storage)
        return storage

    @staticmethod
    def _check_supported(t: torch.Tensor) -> None:
        kind = None
        if t.is_nested:
            kind = "nested tensors"
        elif t.is_quantized:
            kind = "quantized tensors"
        elif t.layout != torch.strided:
            kind = f"tensors with layout {t.layout} (sparse/non-strided)"
        elif type(t).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__ \
                and not isinstance(t, FakeTensor):
            kind = f"tensor subclass {type(t).__qualname__} with its own __torch_dispatch__"
        if kind is not None:
            raise FakeUnsupported(kind)

    def _meta_like(self, t: torch.Tensor) -> torch.Tensor:
        if t.is_meta:
            return t.detach()
        storage = t.untyped_storage()
        key = storage._cdata
        entry = self._storages.get(key)
        if entry is not None and entry[0].expired():
            entry = None
        if entry is None:
            meta_storage = torch.empty(storage.nbytes(), dtype=torch.uint8,
                                       device=_META).untyped_storage()
            if len(self._storages) > 1024:        # drop entries of dead storages now and then
                self._storages = {k: v for k, v in self._storages.items() if not v[0].expired()}
            entry = (StorageWeakRef(storage), meta_storage)   # dies with the real storage
            self._storages[key] = entry
        meta = torch.empty(0, dtype=t.dtype, device=_META)
        meta.set_(entry[1], t.storage_offset(), t.size(), t.stride())
        return meta

    # -- dispatch -----------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self._dispatch(func, args, kwargs or {})

    def _op_info(self, func):
        """(kind, writes): data-dependent/mixed-device/plain, and whether outputs alias a
        mutated input (in-place and out= ops, from the schema's alias annotations)."""
        info = self._op_infos.get(func)
        if info is None:
            name = func.overloadpacket.__name__
            kind = (_KIND_DATA if name in _DATA_DEPENDENT else
                    _KIND_MIXED if name in _MIXED_DEVICE_OK else _KIND_PLAIN)
            writes = any(r.alias_info is not None and r.alias_info.is_write
                         for r in func._schema.returns)
            info = self._op_infos[func] = (kind, writes, FIXUPS.get(func))
        return info

    def _dispatch(self, func, args, kwargs):
        if func.overloadpacket is aten._assert_async:
            return None      # checks data when the real op runs; nothing to compute on fakes
        kind, writes, fixup = self._op_info(func)
        if kind == _KIND_DATA:
            if not (func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is not None):
                raise DataDependentError(str(func))

        if func in _INDEX_PUT and _has_mask_index(args):
            # x[mask] = v: the result has x's geometry whatever the mask holds; meta would need
            # nonzero(mask). (Whether v broadcasts to the masked count is not checked.)
            self_ = self.from_real(args[0])
            if writes:
                return self_
            func = aten.clone.default
            args, kwargs = (self_,), {}
            kind, writes, fixup = self._op_info(func)

        # (a fixup is a function of the arguments' geometry and the device: cached with them)
        cache_key = self._result_key(func, args, kwargs) if kind == _KIND_PLAIN and \
            not writes and not returns_alias(func) else None
        if cache_key is not None:
            recipe = self._results.get(cache_key)
            if recipe is not None:
                return self._from_recipe(recipe)

        fakes = []

        def to_meta(a):
            if isinstance(a, torch.Tensor):
                if not isinstance(a, FakeTensor):
                    a = self.from_real(a)
                fakes.append(a)
                return a._meta
            return a
        args, kwargs = map_args(to_meta, args, kwargs)     # a new kwargs dict

        # Output device.
        device = None
        if "device" in kwargs and kwargs["device"] is not None:
            device = _normalize_device(kwargs["device"])
        elif fakes:
            device = self._common_device(func, fakes, kind == _KIND_MIXED)
        else:
            device = _CPU
        if "device" in kwargs:
            kwargs["device"] = _META
            if kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False

        prior_hint = getattr(DEVICE_HINT, "device", None)
        DEVICE_HINT.device = device.type
        try:
            fast = FAST_META.get(func)
            out = fast(*args, **kwargs) if fast is not None else None
            if out is None:
                out = func(*args, **kwargs)
        except DataDependentError:
            raise
        except (NotImplementedError, RuntimeError) as e:
            msg = str(e)
            if any(w in msg for w in _DATA_DEPENDENT_HINTS):    # e.g. x[mask] -> nonzero
                raise DataDependentError(str(func)) from e
            if isinstance(e, NotImplementedError) or (
                    "Meta" in msg and ("Could not run" in msg or "not implemented" in msg)):
                raise FakeUnsupported(str(func), e) from e
            if any(w in msg for w in _SYMBOLIC_LIMITS) and any(map(_is_symbolic, fakes)):
                raise FakeUnsupported(f"{func} on symbolic sizes", e) from e
            raise
        finally:
            DEVICE_HINT.device = prior_hint

        if fixup is not None:
            out = fixup(out, args, kwargs, device)
        if device.type == "cuda" and not _cuda_guard_ready():
            _check_cuda_autograd(func, fakes)
        by_meta = {id(f._meta): f for f in fakes}

        def wrap(o):
            if not isinstance(o, torch.Tensor) or isinstance(o, FakeTensor):
                return o
            f = by_meta.get(id(o))
            if f is not None:
                if writes:                       # in-place / out=: the mutated fake itself
                    if not _same_geometry(f, o):
                        _restride(f, o)          # t_, unsqueeze_, resize_, set_, out= resize
                    return f
                # A meta kernel returned its input for a non-mutating op (e.g. a decomposition
                # of _to_copy that does nothing on meta): give the result its own tensor.
                o = (o.detach() if func._schema.returns[0].alias_info is not None else
                     torch.empty_strided(o.size(), o.stride(), dtype=o.dtype, device=_META))
            elif o.device.type != "meta":        # an op returned a real tensor (rare)
                return self.from_real(o)
            return FakeTensor(self, o, device)

        if cache_key is not None:
            recipe = _recipe(out, {f._meta.untyped_storage()._cdata for f in fakes}, device)
            if recipe is not None:
                self._results[cache_key] = recipe
        if isinstance(out, torch.Tensor):
            return wrap(out)
        if isinstance(out, (tuple, list)):
            return type(out)(wrap(o) if not isinstance(o, (list, tuple)) else type(o)(map(wrap, o))
                             for o in out)
        return out

    def _result_key(self, func, args, kwargs):
        """The metadata an op's result depends on, or None when something in the arguments
        is not plain (a real tensor, an object): then the op runs its meta kernel."""
        try:
            return (func, _describe(args), _describe(tuple(sorted(kwargs.items()))))
        except _NotPlain:
            return None

    def _from_recipe(self, recipe):
        kind, items = recipe
        outs = [FakeTensor(self, torch.empty_strided(size, stride, dtype=dtype, device=_META),
                           device) for size, stride, dtype, device in items]
        return outs[0] if kind is None else kind(outs)

    @staticmethod
    def _common_device(func, fakes, mixed_ok: bool) -> torch.device:
        device = None
        cpu_scalar = False
        for f in fakes:
            d = f.fake_device
            if device is None:
                device = d
                cpu_scalar = d.type == "cpu" and f.dim() == 0
                continue
            if d == device:
                if cpu_scalar and f.dim() != 0:
                    cpu_scalar = False
                continue
            is_cpu_scalar = d.type == "cpu" and f.dim() == 0
            if is_cpu_scalar:
                continue                          # 0-dim cpu tensors don't decide the device
            if cpu_scalar:                        # the device so far came from a cpu scalar
                device, cpu_scalar = d, False
                continue
            if mixed_ok:
                continue                          # first argument's device decides
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two "
                f"devices, {device} and {d}! (when running {func} on fake tensors)")
        return device


class _NotPlain(Exception):
    pass


_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
          torch.memory_format)


class _NotFlat(Exception):
    pass


_SEQUENCES = (list, tuple, torch.Size)


def map_args(fn, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``pytree.tree_map(fn, (args, kwargs))`` for an op's arguments, without pytree's
    generality (a fifth of tracing a graph went to it): ATen arguments are values and
    lists, tuples or sizes of values. Anything else that holds values (a namedtuple, a
    dict) goes through pytree. ``fn`` may be called again on a value it has seen."""
    try:
        return (tuple(_map_value(fn, a) for a in args),
                {k: _map_value(fn, v) for k, v in kwargs.items()})
    except _NotFlat:
        return pytree.tree_map(fn, (args, kwargs))


def _map_value(fn, value):
    kind = type(value)
    if kind in _SEQUENCES:      # a size comes back a tuple, as from pytree
        mapped = [_map_value(fn, v) for v in value]
        return mapped if kind is list else tuple(mapped)
    if isinstance(value, (list, tuple, dict)):
        raise _NotFlat
    return fn(value)


def _describe(value):
    """A hashable description of an op's argument for the result cache: fakes by geometry,
    plain values by value; anything else is not cached (``_NotPlain``)."""
    if isinstance(value, FakeTensor):
        return ("T", _sizes_key(value.shape), _sizes_key(value.stride()),
                _size_key(value.storage_offset()), value.dtype, value.fake_device,
                value.requires_grad)
    if isinstance(value, torch.Tensor):
        raise _NotPlain
    if isinstance(value, torch.SymInt):
        return _size_key(value)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_describe(v) for v in value))
    if isinstance(value, float) and value != value:
        return ("nan",)
    if isinstance(value, _PLAIN):
        return (type(value), value)
    raise _NotPlain


def _size_key(n):
    """A size as a hashable key: an int, or a SymInt's expression (a mode's fakes share one
    ShapeEnv, so equal expressions are equal sizes; SymInts themselves are unhashable)."""
    return n if type(n) is int else ("sym", n.node.expr)


def _sizes_key(sizes) -> tuple:
    sizes = tuple(sizes)
    try:
        hash(sizes)                  # all ints (the static case: as fast as before)
        return sizes
    except TypeError:                # a SymInt
        return tuple(n if type(n) is int else ("sym", n.node.expr) for n in sizes)


def _is_symbolic(t: torch.Tensor) -> bool:
    return any(type(n) is not int for n in (*t.shape, *t.stride(), t.storage_offset()))


def _same_geometry(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same sizes, strides and offset, compared structurally: comparing SymInts with ``==``
    would record guards."""
    return (_sizes_key(a.shape) == _sizes_key(b.shape)
            and _sizes_key(a.stride()) == _sizes_key(b.stride())
            and _size_key(a.storage_offset()) == _size_key(b.storage_offset()))


def storage_key(t: torch.Tensor) -> int:
    """An id of ``t``'s storage, the same for every view of it (a fake tensor's meta
    storage)."""
    return getattr(t, "_meta", t).untyped_storage()._cdata


@functools.lru_cache(maxsize=None)
def returns_alias(func) -> bool:
    """The schema says an output is a view of an input (``Tensor(a)``)."""
    return any(r.alias_info is not None for r in func._schema.returns)


def _recipe(out, input_storages: set, device: torch.device):
    """How to make ``out`` again: (container type or None, [(size, stride, dtype, device)]),
    when every output is a new meta tensor at offset 0 with storage of its own (not one of
    the inputs', whatever the schema says); else None."""
    items = [out] if isinstance(out, torch.Tensor) else list(out) \
        if isinstance(out, (tuple, list)) else None
    if not items:
        return None
    recipe = []
    for o in items:
        if not isinstance(o, torch.Tensor) or isinstance(o, FakeTensor) or \
                o.device.type != "meta" or _size_key(o.storage_offset()) != 0 or \
                o.untyped_storage()._cdata in input_storages:
            return None
        recipe.append((tuple(o.shape), o.stride(), o.dtype, device))
    return (None if isinstance(out, torch.Tensor) else type(out)), recipe
