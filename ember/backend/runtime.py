"""Helpers the generated wrapper calls at run time."""
from __future__ import annotations

import torch


def reinterpret(base: torch.Tensor, size, stride, offset: int) -> torch.Tensor:
    """A view of ``base``'s memory; ``offset`` counts elements from base's data pointer."""
    return torch.as_strided(base, size, stride, base.storage_offset() + offset)


def check_layout(t: torch.Tensor, size, stride) -> None:
    """An ATen call returned the layout the compiled kernels were generated for."""
    if t.stride() == stride and t.shape == size:     # the common case, in ~0.3 us
        return
    if tuple(t.shape) != size or (t.numel() > 0 and any(
            a != b for s, a, b in zip(size, t.stride(), stride) if s != 1)):
        raise RuntimeError(f"ember: ATen call returned size {tuple(t.shape)} stride "
                           f"{t.stride()}, kernels expect size {size} stride {stride}")
