"""The benchmark's kernel rows: three memory-bound programs measured in GB/s against ``copy_``.

- ``pointwise``: a chain of 10 pointwise ops over three tensors, ``tanh(relu(sin(x*2+1)*y) /
  (1+exp(z))) - 0.5``: one fused loop against ten passes over memory.
- ``softmax``: ``torch.softmax(x, -1)``.
- ``layer_norm``: ``F.layer_norm`` over the last dim, with weight and bias.

Each kernel moves a known minimum number of bytes per call (``KernelCase.bytes_moved``): every
input read once and the output written once (pointwise: 3 inputs + 1 output; softmax: 1 + 1;
layer_norm: 1 + 1, plus its weight and bias). Achieved GB/s is that count over the time of a
call. The reference is a plain ``dst.copy_(src)`` that moves the same number of bytes (it reads
half of them and writes the other half), timed in the same rounds as the kernels, so "fraction
of copy" is how close a kernel comes to the memory bandwidth that this machine shows right now.

Sizes are given as bytes per input tensor (``tensor_bytes``), so a bfloat16 row has twice the
elements of a float32 row of the same size. The default depends on the device: 2^28 bytes
(256 MiB) on CUDA, several times an H200's 60 MB L2 and enough blocks to fill every
multiprocessor; 2^22 bytes (4 MiB) on the CPU, a few milliseconds per eager call on 2 cores.
softmax and layer_norm rows are 4096 elements long on CUDA (a large hidden size) and 1024 on
the CPU; a size too small for one full row becomes a single shorter row.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn.functional as F

CUDA_TENSOR_BYTES = 2 ** 28
CPU_TENSOR_BYTES = 2 ** 22


def pointwise(x, y, z):
    # 10 ops: mul, add, sin, mul, relu, exp, add, div, tanh, sub
    return (((x * 2 + 1).sin() * y).relu() / (1 + z.exp())).tanh() - 0.5


def softmax(x):
    return torch.softmax(x, dim=-1)


def layer_norm(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, 1e-5)


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    name: str
    description: str
    fn: Callable
    # make(numel, row_length, device, dtype) -> inputs; numel is the main tensor's size
    make: Callable[[int, int, torch.device, torch.dtype], tuple]
    rowwise: bool   # True: the main tensor is (rows, row_length) and reduced over rows


def _make_pointwise(numel, row_length, device, dtype):
    return tuple(torch.randn(numel, device=device, dtype=dtype) for _ in range(3))


def _make_softmax(numel, row_length, device, dtype):
    return (torch.randn(numel // row_length, row_length, device=device, dtype=dtype),)


def _make_layer_norm(numel, row_length, device, dtype):
    return (torch.randn(numel // row_length, row_length, device=device, dtype=dtype),
            torch.randn(row_length, device=device, dtype=dtype),
            torch.randn(row_length, device=device, dtype=dtype))


KERNELS: dict[str, KernelSpec] = {spec.name: spec for spec in [
    KernelSpec("pointwise", "10-op pointwise chain over 3 tensors", pointwise,
               _make_pointwise, rowwise=False),
    KernelSpec("softmax", "softmax over the last dim", softmax, _make_softmax, rowwise=True),
    KernelSpec("layer_norm", "layer_norm over the last dim, with weight and bias", layer_norm,
               _make_layer_norm, rowwise=True),
]}


@dataclasses.dataclass
class KernelCase:
    """One kernel row, built: the function, its inputs and the bytes it must move."""
    name: str
    fn: Callable
    inputs: tuple
    bytes_moved: int          # minimum bytes read + written by one call

    @property
    def copy_numel(self) -> int:
        """Elements of a copy_ that moves ``bytes_moved`` (read half, write half)."""
        return self.bytes_moved // (2 * self.inputs[0].element_size())


def known() -> list[str]:
    return list(KERNELS)


def default_tensor_bytes(device: str | torch.device) -> int:
    return CUDA_TENSOR_BYTES if torch.device(device).type == "cuda" else CPU_TENSOR_BYTES


def default_row_length(device: str | torch.device) -> int:
    return 4096 if torch.device(device).type == "cuda" else 1024


def build_kernel(name: str, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32,
                 tensor_bytes: int | None = None) -> KernelCase:
    """Seeded inputs of ``tensor_bytes`` bytes each (the device's default when None)."""
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r}; known kernels: {', '.join(KERNELS)}")
    if not dtype.is_floating_point:
        raise ValueError(f"kernel rows need a floating-point dtype, got {dtype}")
    spec = KERNELS[name]
    device = torch.device(device)
    tensor_bytes = default_tensor_bytes(device) if tensor_bytes is None else tensor_bytes
    numel = tensor_bytes // dtype.itemsize
    if numel < 1:
        raise ValueError(f"tensor_bytes={tensor_bytes} is smaller than one {dtype} element")
    row_length = min(default_row_length(device), numel) if spec.rowwise else 1
    numel -= numel % row_length
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        inputs = spec.make(numel, row_length, device, dtype)
    output_bytes = inputs[0].numel() * inputs[0].element_size()
    input_bytes = sum(t.numel() * t.element_size() for t in inputs)
    return KernelCase(name, spec.fn, inputs, input_bytes + output_bytes)
