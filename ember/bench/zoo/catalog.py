"""The zoo's catalog: model name -> ``ModelSpec`` (factory, suite, default batch and
dtype, the optional package it needs), and building a model by name.

``register_model`` adds a model (the suite modules call it when they are imported);
``build_model`` builds one, seeded, on a device in a dtype and mode; ``in_suite``,
``available``, ``check_names`` and ``resolve`` look models up; a user's ``module:callable``
(or ``file.py:callable``) is resolved here too (``load_callable``). This module registers no
model and imports no suite: the suites import it, and ``ember.bench.zoo`` imports both.

Each model has a default batch size (per device type) and dtype; ``build_model(batch_size=,
dtype=)`` overrides them. A factory takes ``(device, batch_size)``; ``build_model`` casts the
model's floating-point parameters and buffers and the floating-point inputs to the dtype
(integer inputs, such as token ids, stay integer). ``build_model(mode="train")`` returns the
model in ``train()`` mode with every dropout probability set to 0 (so a training step is
deterministic and comparable across compilers and dtypes).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any, Callable

import torch
from torch import nn

from ember.bench import compat

Factory = Callable[[torch.device, int], tuple[nn.Module, tuple]]

SUITES = ("builtin", "timm", "hf", "torchvision", "gpu")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Factory              # build(device, batch_size), the random state already seeded
    requires: str | None = None  # optional package the model needs ("timm", "transformers")
    description: str = ""
    batch_size: int | None = 1   # default batch on the CPU (None: a user's model's own)
    cuda_batch_size: int | None = None   # default batch on CUDA (None: batch_size)
    dtype: torch.dtype | None = torch.float32   # default dtype (None: the model's own)
    suite: str | None = "builtin"   # None: a user's model
    cuda_train_batch_size: int | None = None   # default batch on CUDA in train mode
    modes: tuple[str, ...] = ("infer", "train")   # the modes its suite runs it in

    def default_batch_size(self, device: str | torch.device,
                           mode: str = "infer") -> int | None:
        if torch.device(device).type == "cuda":
            if mode == "train" and self.cuda_train_batch_size is not None:
                return self.cuda_train_batch_size
            if self.cuda_batch_size is not None:
                return self.cuda_batch_size
        return self.batch_size


MODELS: dict[str, ModelSpec] = {}


def register_model(name: str, *, requires: str | None = None, description: str = "",
                   batch_size: int = 1, cuda_batch_size: int | None = None,
                   dtype: torch.dtype = torch.float32, suite: str = "builtin",
                   cuda_train_batch_size: int | None = None,
                   modes: tuple[str, ...] = ("infer", "train")):
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")

    def deco(build: Factory) -> Factory:
        MODELS[name] = ModelSpec(name, build, requires, description, batch_size,
                                 cuda_batch_size, dtype, suite, cuda_train_batch_size, modes)
        return build
    return deco


class UnknownModelError(ValueError):
    pass


class ModelUnavailableError(RuntimeError):
    pass


_IMPORTERS = {"timm": compat.import_timm, "transformers": compat.import_transformers,
              "torchvision": compat.import_torchvision}


def is_available(name: str) -> bool:
    spec = MODELS[name]
    return spec.requires is None or _IMPORTERS[spec.requires]() is not None


def missing_package(name: str) -> str | None:
    """The optional package model ``name`` needs and that is not installed, without importing
    anything (None: nothing missing)."""
    spec = MODELS[name]
    if spec.requires is None or importlib.util.find_spec(spec.requires) is not None:
        return None
    return spec.requires


def is_user_model(name: str) -> bool:
    """``module:callable`` or ``file.py:callable``: a user's model factory."""
    return ":" in name


def load_callable(spec: str) -> Callable:
    """The callable named by ``module:attr`` (the current folder is on the path, as for
    ``python -m``) or ``path/to/file.py:attr``; ValueError says what is wrong."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ValueError(f"{spec!r}: expected module:callable or file.py:callable")
    if target.endswith(".py") or os.sep in target:
        if not os.path.isfile(target):
            raise ValueError(f"{spec!r}: no file {target!r}")
        module_name = "_ember_bench_user_" + os.path.splitext(os.path.basename(target))[0]
        file_spec = importlib.util.spec_from_file_location(module_name, target)
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[module_name] = module
        file_spec.loader.exec_module(module)
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ValueError(f"{spec!r}: cannot import {target!r}: {e}") from None
    value = getattr(module, attr, None)
    if not callable(value):
        raise ValueError(f"{spec!r}: {target!r} has no callable {attr!r}")
    return value


def _user_factory(spec: str) -> Factory:
    def build(device, batch_size):
        make = load_callable(spec)
        params = inspect.signature(make).parameters
        kwargs = {}
        if "device" in params:
            kwargs["device"] = device
        if "batch_size" in params:
            kwargs["batch_size"] = batch_size
        elif batch_size is not None:
            raise ValueError(f"--batch-size: {spec} takes no batch_size parameter")
        result = make(**kwargs)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError(f"{spec} must return (model, example_inputs), got "
                            f"{type(result).__name__}")
        model, inputs = result
        return model, inputs if isinstance(inputs, dict) else tuple(inputs)
    return build


def resolve(name: str) -> ModelSpec:
    """The spec of a zoo model or of a user's ``module:callable``."""
    if is_user_model(name):
        return ModelSpec(name, _user_factory(name), batch_size=None, dtype=None, suite=None,
                         description=f"user model {name}")
    check_names([name])
    return MODELS[name]


def known() -> list[str]:
    return list(MODELS)


def available(suite: str | None = None) -> list[str]:
    """Registered models whose optional package is installed, in registration order; only
    those of ``suite`` when given."""
    return [name for name in in_suite(suite) if is_available(name)]


def in_suite(suite: str | None = None, mode: str | None = None) -> list[str]:
    """Registered models of ``suite`` (every model when None), installed or not; with
    ``mode``, only those the suite runs in that mode (``ModelSpec.modes``)."""
    if suite is not None and suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    return [name for name, spec in MODELS.items() if (suite is None or spec.suite == suite)
            and (mode is None or mode in spec.modes)]


def check_names(names: list[str]) -> None:
    """Raise a clear error for names that are not registered or whose package is missing."""
    unknown = [n for n in names if n not in MODELS and not is_user_model(n)]
    if unknown:
        raise UnknownModelError(f"unknown model(s): {', '.join(unknown)}; known models: "
                                f"{', '.join(MODELS)}")
    for name in names:
        if not is_user_model(name) and not is_available(name):
            raise ModelUnavailableError(
                f"model {name!r} needs the {MODELS[name].requires!r} package; install the "
                f"benchmark extras: pip install torch==2.13.0 -e '.[bench]'")


def build_model(name: str, device: str | torch.device = "cpu", *,
                dtype: torch.dtype | None = None, batch_size: int | None = None,
                mode: str = "infer", amp: torch.dtype | None = None
                ) -> tuple[nn.Module, tuple]:
    """A fresh, seeded model on ``device`` and its example inputs (a tuple).

    ``name``: a zoo model or a user's ``module:callable``. ``dtype`` (default: the model's,
    float32 for the zoo but the gpu suite) casts the floating-point parameters, buffers and
    inputs; ``batch_size`` (default: the model's for this device type) is the inputs' first
    dim. ``mode``: "infer" (``eval()``) or "train" (``train()``, dropout probabilities 0).
    ``amp`` (float16 or bfloat16): mixed precision as users write it: weights and inputs
    float32, the model wrapped in ``Autocast`` (``dtype`` must then be None or float32)."""
    spec = resolve(name)
    if mode not in ("infer", "train"):
        raise ValueError(f"mode must be infer or train, got {mode!r}")
    device = torch.device(device)
    if amp is not None:
        if amp not in (torch.float16, torch.bfloat16) or dtype not in (None, torch.float32):
            raise ValueError(f"amp autocasts float32 weights to float16 or bfloat16, got "
                             f"amp={amp}, dtype={dtype}")
        dtype = torch.float32
    dtype = spec.dtype if dtype is None else dtype
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"models are cast to a floating-point dtype, got {dtype}")
    batch_size = spec.default_batch_size(device, mode) if batch_size is None else batch_size
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        model, inputs = spec.build(device, batch_size)
    if isinstance(inputs, dict):
        model, inputs = KeywordCall(model, list(inputs)), tuple(inputs.values())
    inputs = tuple(_to(t, device, dtype) for t in inputs)
    model = model.to(device=device) if dtype is None else model.to(device=device, dtype=dtype)
    if amp is not None:
        model = Autocast(model, device.type, amp)
    if mode == "train":
        for module in model.modules():
            if isinstance(module, nn.modules.dropout._DropoutNd):
                module.p = 0.0
        return model.train(), inputs
    return model.eval(), inputs


class Autocast(nn.Module):
    """``model`` run under ``torch.autocast(device_type, dtype)`` entered in this forward, so
    inside the compiled frame: automatic mixed precision as training scripts write it
    (float32 weights and gradients, matmuls and convolutions in ``dtype``). The accuracy
    reference calls ``.model`` directly, without autocast."""

    def __init__(self, model: nn.Module, device_type: str, dtype: torch.dtype):
        super().__init__()
        self.model, self.device_type, self.dtype = model, device_type, dtype

    def forward(self, *args):
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.model(*args)


def _to(value: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    if dtype is not None and value.is_floating_point():
        return value.to(device=device, dtype=dtype)
    return value.to(device=device)


class KeywordCall(nn.Module):
    """Calls ``model(**dict(zip(names, args)))``: a model that takes keyword inputs (an
    encoder-decoder's ``input_ids`` and ``decoder_input_ids``) called as ``model(*inputs)``."""

    def __init__(self, model: nn.Module, names: list[str]):
        super().__init__()
        self.model = model
        self.names = tuple(names)

    def forward(self, *args):
        return self.model(**dict(zip(self.names, args)))
