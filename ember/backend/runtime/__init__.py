"""What compiled graphs use when they run: here, the helpers the generated wrapper calls
(``from ember.backend.runtime import with_layout``: generated code names this module, so
they stay at the package's top); ``graph_cache.py`` (compiled graphs on disk),
``disk_cache.py`` (the cache directory, its checks and eviction), ``cudagraphs.py`` (a
compiled graph replayed as one CUDA graph), ``eager_choice.py`` (a graph run compiled or
eagerly, whichever is faster), ``per_size.py`` (one of those per size of a symbolic
program)."""
from __future__ import annotations

import torch


def reinterpret(base: torch.Tensor, size, stride, offset: int) -> torch.Tensor:
    """A view of ``base``'s memory; ``offset`` counts elements from base's data pointer."""
    return torch.as_strided(base, size, stride, base.storage_offset() + offset)


_relayouts_logged: set = set()


def with_layout(t: torch.Tensor, size, stride, dtype: torch.dtype | None = None
                ) -> torch.Tensor:
    """``t`` (an ATen call's result) in the layout the compiled kernels were generated for: a
    copy when ATen chose another one (its choice can follow input strides that differ from
    the traced ones: a depthwise convolution of a value Ember stored NCHW, grouped-query
    attention), logged once per layout under ``EMBER_LOGS=perf_hints``. A result of another
    dtype than its meta kernel said is converted to that dtype, which the compiled program
    was traced with (warned once per pair of dtypes)."""
    if dtype is not None and t.dtype != dtype:
        _warn_dtype(t.dtype, dtype)
        t = t.to(dtype)
    if t.stride() == stride and t.shape == size:     # the common case, in ~0.3 us
        return t
    if tuple(t.shape) != size:
        raise RuntimeError(f"ember: ATen call returned size {tuple(t.shape)}, kernels expect "
                           f"size {size}")
    if t.numel() == 0 or all(a == b for n, a, b in zip(size, t.stride(), stride) if n != 1):
        return t
    key = (size, stride, t.stride())
    if key not in _relayouts_logged:
        from ember import logs
        _relayouts_logged.add(key)
        logs.log("perf_hints", "ATen call returned size %s stride %s, kernels expect stride "
                 "%s: copied on every call", size, t.stride(), stride)
    return torch.empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)


_dtypes_warned: set = set()


def _warn_dtype(got: torch.dtype, want: torch.dtype) -> None:
    if (got, want) not in _dtypes_warned:
        from ember import logs
        _dtypes_warned.add((got, want))
        logs.warn("ember: an ATen call returned %s where its meta kernel says %s (a torch "
                  "meta kernel bug); converted on every call", got, want)
