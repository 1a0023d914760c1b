"""The benchmark's model zoo: registry name -> factory building ``(model, example_inputs)``.

Three built-in models need nothing but torch and cover the main shapes of work: ``mlp``
(matmuls and pointwise), ``convnet`` (convolution, batch norm, pooling) and
``transformer_block`` (layer norm, hand-written attention with softmax, matmuls). Models from
timm and transformers join when those packages are installed (``available()``), built from
configs with random weights: nothing is downloaded.

Every factory seeds torch's generator inside ``fork_rng`` so weights and inputs are the same on
every run without disturbing the caller's random state, and returns the model in ``eval()``
mode (dropout off, batch norm on running statistics) so outputs are deterministic. Input sizes
of the ``builtin`` suite are small on purpose: the benchmark and the model tests run on a
2-core CPU.

Suites (``SUITES``): ``builtin`` (the models above: nothing but torch, the default of ``ember
bench``); ``timm``, ``hf`` and ``torchvision`` (real architectures from those libraries,
CNNs, vision and language transformers, decoders, encoder-decoders, speech); and ``gpu``:
timm resnet50, mobilenetv3_large_100 and vit_base_patch16_224, HF BERT-base and GPT-2 (base
models, no task head; ``use_cache=False`` so GPT-2 returns only tensors), meant for a large
GPU in bfloat16 at batch 64/64/32 and 16 x 512 tokens. In train mode the suite is issue 10's
training benchmark: resnet50 (64), vit_base (32), BERT-base (16 x 512) and GPT-2 (8 x 512);
mobilenetv3 is inference only (``ModelSpec.modes``, ``cuda_train_batch_size``). On the CPU
the large models get batch 1 (and 128 tokens).

A user's model is ``module:callable`` (or ``path/to/file.py:callable``): a function returning
``(model, example_inputs)``; it may take ``device`` and ``batch_size`` keywords. Example inputs
are a tuple of positional arguments or a dict of keyword arguments (then the model is wrapped
in ``KeywordCall``, which takes them positionally, so every model is called as
``model(*inputs)``).

Modules: ``catalog`` (``ModelSpec``, ``register_model``, ``build_model`` and the look-ups,
re-exported here), and one module per library the models come from, each registering its
models when imported: ``builtin`` (torch only), ``timm``, ``hf`` (transformers) and
``torchvision``. ``import timm`` and ``import torchvision`` still find the libraries: imports
are absolute, and the libraries are imported through ``ember.bench.compat``. Models are
registered in the order of those imports (builtin, timm, hf, torchvision), which is the order
``in_suite`` lists each suite's models in. The suite modules import only ``catalog`` (and
``compat``), never one another or this package's namespace: no import cycles.
"""
from __future__ import annotations

from ember.bench.zoo.catalog import (DTYPES, MODELS, SUITES, Autocast, Factory, KeywordCall,
                                     ModelSpec, ModelUnavailableError, UnknownModelError,
                                     available, build_model, check_names, in_suite,
                                     is_available, is_user_model, known, load_callable,
                                     missing_package, register_model, resolve)
# the suite modules register their models when imported, in this order
from ember.bench.zoo import builtin, timm, hf, torchvision  # noqa: I001

SUITE_MODULES = (builtin, timm, hf, torchvision)

__all__ = ["DTYPES", "MODELS", "SUITES", "Autocast", "Factory", "KeywordCall", "ModelSpec",
           "ModelUnavailableError", "UnknownModelError", "available", "build_model",
           "check_names", "in_suite", "is_available", "is_user_model", "known",
           "load_callable", "missing_package", "register_model", "resolve"]
