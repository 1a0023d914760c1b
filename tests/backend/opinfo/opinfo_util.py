"""OpInfo-driven conformance harness for the ``"ember"`` backend (``test_opinfo.py``).

For each OpInfo of ``torch.testing._internal.common_methods_invocations.op_db``, each dtype of
float32/int64/bool the op supports on the CPU, and each of its first K sample inputs, a
function is generated whose positional parameters are exactly the sample's tensors (input,
args, kwargs, tensors nested in lists/tuples/dicts) and whose other arguments are constants::

    def f(t0, t1):  return _op(t0, [t1], dim=1, alpha=_c0)

It runs eagerly and through ``ember.compile(f, backend=<counting wrapper of "ember">)`` on two
identical copies of the tensors (storage, offset, sizes and strides kept); outputs and the
inputs after the call (in-place mutation) are compared with ``torch.testing.assert_close``
(``equal_nan=True``; float tolerances from the OpInfo's ``toleranceOverride`` decorators if any,
else assert_close's defaults; integer/bool exact). Each (op, dtype, sample) gets one outcome:

- ``kernel``: passed, ``metrics.generated_kernel_count`` > 0 and no ``metrics.fallback_ops``;
- ``fallback``: passed and some ATen op ran through ``metrics.fallback_ops``;
- ``eager-graph``: passed, a graph reached the backend, no kernel generated and no fallback
  recorded (the state while the backend runs graphs eagerly);
- ``no-graph``: passed, the frontend captured the frame but produced no graph (nothing to
  compile, e.g. an op that returns its input);
- ``frontend-eager``: passed, but the frontend could not capture the frame (ran it eagerly);
- ``skip``: eager itself raised, sample generation failed, or the sample needs
  complex/sparse/autograd;
- ``fail``: a mismatch, or the compiled call raised while eager did not.

``ember.reset()`` runs before each sample (clears compiled entries and backend metrics).

Environment:
- ``EMBER_OPINFO_FULL=1``: every op, every sample, and the in-place variants too. Default (CI):
  a fixed quarter of the ops (crc32 of the name) plus ``MUST_RUN``, at most 2 samples per
  (op, dtype), in-place variants not run.
- ``EMBER_OPINFO_K=N``: at most N samples per (op, dtype) (overrides the mode's default;
  ``0`` = all).
- ``EMBER_OPINFO_OPS=add,mul,...``: exactly these ops (full names, ``name.variant``).
- ``EMBER_OPINFO_REPORT=path.json``: write totals and per-sample outcomes there at the end.
- ``EMBER_OPINFO_SHARD=i/n``: only the ops whose name hashes to shard ``i`` of ``n`` (to run a
  full sweep as ``n`` processes side by side).

Targets: ``cpu_backend`` of ``run_op``/``run_sample`` picks the kernel language (``"cpp"``, or
``"triton"``: the same Triton kernels a GPU gets, run by Triton's interpreter; see
``test_opinfo_triton.py``). Each target keeps its own outcomes (``RESULTS[target]``) and
summary line.
"""
from __future__ import annotations

import collections
import functools
import math
import os
import traceback
import types
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

import ember
from ember.backend import compile_stats
from ember.backend_registry import ember_backend

CATEGORIES = ("kernel", "fallback", "eager-graph", "no-graph", "frontend-eager", "skip", "fail")

DTYPES = (torch.float32, torch.int64, torch.bool)

# Ops always run in CI mode (matched on OpInfo.name: every variant of the name runs).
MUST_RUN = frozenset("""
    add mul sub div nn.functional.relu sigmoid tanh exp log sqrt abs neg where clamp
    sum mean amax amin var std softmax log_softmax nn.functional.layer_norm nn.functional.gelu
    cat index_select gather nn.functional.embedding arange full zeros_like
    to type_as float double long int bool byte
""".split())

# Ops whose outputs are random: compared with the RNG seeded identically before both runs; if
# that differs (a compiler may draw random numbers differently), only metadata is compared.
# Matched against the words of the op's full name (split at "." and "_").
_RANDOM_WORDS = frozenset(("dropout", "dropout1d", "dropout2d", "dropout3d", "bernoulli",
                           "multinomial", "normal", "rand", "randn", "randint", "uniform",
                           "exponential", "geometric", "cauchy", "rrelu", "fractional"))
_NOT_RANDOM = frozenset(("__rand__", "native_dropout_backward", "signal.windows.exponential"))
# Ops random by what they do inside (a random projection), or only for some samples: those
# with dropout (sdpa's dropout_p; multi_head_attention_forward's dropout_p, its 11th
# argument, in training).
_RANDOM_OPS = frozenset(("svd_lowrank", "pca_lowrank"))
_RANDOM_SAMPLES = {
    "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0) > 0,
    "nn.functional.multi_head_attention_forward":
        lambda s: s.kwargs.get("training", True) and s.args[9] > 0,
}
# Ops whose outputs are uninitialized memory: only metadata is compared.
_UNINITIALIZED_WORDS = frozenset(("empty",))


def draws_random(name: str, sample) -> bool:
    """Whether the op's outputs for ``sample`` come from random draws."""
    if name in _RANDOM_SAMPLES:
        return bool(_RANDOM_SAMPLES[name](sample))
    return name in _RANDOM_OPS or (bool(_name_words(name) & _RANDOM_WORDS)
                                   and name not in _NOT_RANDOM)


def _name_words(name: str) -> set[str]:
    return set(name.replace(".", "_").split("_"))


def full_mode() -> bool:
    return os.environ.get("EMBER_OPINFO_FULL", "") not in ("", "0")


def samples_per_op() -> int | None:
    k = os.environ.get("EMBER_OPINFO_K")
    if k is not None and k != "":
        return int(k) or None
    return None if full_mode() else 2


def op_full_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _in_ci_subset(op) -> bool:
    return op.name in MUST_RUN or zlib.crc32(op_full_name(op).encode()) % 4 == 0


def selected_ops() -> list:
    """The OpInfos this run tests, in op_db order (deterministic)."""
    from torch.testing._internal.common_methods_invocations import op_db
    only = os.environ.get("EMBER_OPINFO_OPS", "")
    if only:
        wanted = {s.strip() for s in only.split(",") if s.strip()}
        return [op for op in op_db if op_full_name(op) in wanted or op.name in wanted]
    ops = list(op_db) if full_mode() else [op for op in op_db if _in_ci_subset(op)]
    shard = os.environ.get("EMBER_OPINFO_SHARD", "")
    if shard:
        i, n = (int(v) for v in shard.split("/"))
        ops = [op for op in ops if zlib.crc32(op_full_name(op).encode()) // 4 % n == i]
    return ops


# ---------------------------------------------------------------------- building the function

_LITERAL_TYPES = (bool, int, str, type(None))


class _Builder:
    """Turns a sample's (input, args, kwargs) into source text over t0..tn and constants."""

    def __init__(self):
        self.tensors: list[torch.Tensor] = []
        self.consts: dict[str, Any] = {}
        self.problem: str | None = None   # why the sample is skipped (complex, sparse, ...)

    def expr(self, x: Any) -> str:
        if isinstance(x, torch.Tensor):
            if x.layout != torch.strided:
                self.problem = self.problem or f"needs sparse ({x.layout})"
            elif x.is_complex():
                self.problem = self.problem or "needs complex"
            elif x.requires_grad:
                self.problem = self.problem or "needs autograd"
            self.tensors.append(x)
            return f"t{len(self.tensors) - 1}"
        if type(x) is list:
            return "[" + ", ".join(self.expr(v) for v in x) + "]"
        if type(x) is tuple:
            return "(" + "".join(self.expr(v) + ", " for v in x) + ")"
        if type(x) is dict and all(type(k) is str for k in x):
            return "{" + ", ".join(f"{k!r}: {self.expr(v)}" for k, v in x.items()) + "}"
        if isinstance(x, complex):
            self.problem = self.problem or "needs complex"
        if type(x) in _LITERAL_TYPES or (type(x) is float and math.isfinite(x)):
            return repr(x)
        name = f"_c{len(self.consts)}"
        self.consts[name] = x
        return name


def build_function(callable_, sample):
    """(fn, tensors, problem): ``fn(*tensors)`` calls ``callable_`` on the sample."""
    b = _Builder()
    parts = [b.expr(sample.input)]
    parts += [b.expr(a) for a in sample.args]
    parts += [f"{k}={b.expr(v)}" for k, v in sample.kwargs.items()]
    params = ", ".join(f"t{i}" for i in range(len(b.tensors)))
    src = f"def opinfo_fn({params}):\n    return _op({', '.join(parts)})\n"
    namespace = {"_op": callable_, **b.consts}
    exec(compile(src, "<opinfo_fn>", "exec"), namespace)
    fn = namespace["opinfo_fn"]
    fn.__opinfo_src__ = src
    return fn, b.tensors, b.problem


def copy_tensor(t: torch.Tensor) -> torch.Tensor:
    """A copy with its own storage and the same offset, sizes and strides (views stay views)."""
    storage = t.untyped_storage().clone()
    out = torch.empty(0, dtype=t.dtype, device=t.device)
    out.set_(storage, t.storage_offset(), t.size(), t.stride())
    return out


# ---------------------------------------------------------------------- comparing


def float_tolerance(op, dtype) -> tuple[float, float] | None:
    """(rtol, atol): the loosest ``toleranceOverride`` among the OpInfo's decorators, if any."""
    try:
        from torch.testing._internal.common_device_type import toleranceOverride
    except Exception:  # pragma: no cover
        return None
    best = None
    for deco_info in getattr(op, "decorators", ()) or ():
        decos = getattr(deco_info, "decorators", None)
        if decos is None:
            decos = [deco_info]
        for d in decos:
            if isinstance(d, toleranceOverride) and dtype in d.d:
                tol = d.d[dtype]
                rtol, atol = float(tol.rtol), float(tol.atol)
                best = (rtol, atol) if best is None else (max(best[0], rtol), max(best[1], atol))
    return best


def _leaves(x: Any) -> list:
    if isinstance(x, (list, tuple)):
        return [leaf for v in x for leaf in _leaves(v)]
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in _leaves(v)]
    return [x]


def _assert_meta_equal(actual: Any, expected: Any) -> None:
    a, e = _leaves(actual), _leaves(expected)
    assert len(a) == len(e), f"output structure differs: {len(a)} vs {len(e)} leaves"
    for x, y in zip(a, e):
        if isinstance(y, torch.Tensor):
            assert isinstance(x, torch.Tensor), f"expected a tensor, got {type(x).__name__}"
            assert (x.shape, x.dtype, x.device) == (y.shape, y.dtype, y.device), \
                f"metadata differs: {(x.shape, x.dtype)} vs {(y.shape, y.dtype)}"
        else:
            assert type(x) is type(y), f"type differs: {type(x).__name__} vs {type(y).__name__}"


def assert_same(actual: Any, expected: Any, tol: tuple[float, float] | None) -> None:
    kwargs: dict = dict(equal_nan=True)
    if tol is not None:
        kwargs.update(rtol=tol[0], atol=tol[1])
    try:
        torch.testing.assert_close(actual, expected, **kwargs)
    except TypeError:
        # Non-numeric outputs (a dtype, a string, a torch.Size mixed with tensors, ...).
        if not ember.testing.same(actual, expected):
            raise AssertionError(f"outputs differ: {actual!r} vs {expected!r}") from None


def _has_complex_or_sparse(x: Any) -> str | None:
    for leaf in _leaves(x):
        if isinstance(leaf, torch.Tensor):
            if leaf.layout != torch.strided:
                return f"output is sparse ({leaf.layout})"
            if leaf.is_complex():
                return "output is complex"
        elif isinstance(leaf, complex):
            return "output is complex"
    return None


# ---------------------------------------------------------------------- running one sample

class _CountingBackend:
    """Counts the graphs the frontend hands to the (real) ``"ember"`` backend, which
    generates kernels in the ``cpu_backend`` language."""

    def __init__(self, inner=None, cpu_backend: str = "cpp"):
        self.inner = inner if inner is not None else functools.partial(
            ember_backend, cpu_backend=cpu_backend)
        self.frame_count = 0
        self.op_count = 0

    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        self.op_count += sum(1 for n in gm.graph.nodes if n.op.startswith("call_"))
        return self.inner(gm, example_inputs)


@dataclass
class Outcome:
    op: str
    dtype: str
    sample: int
    variant: str            # "out-of-place" or "inplace"
    category: str
    detail: str = ""
    fallback_ops: dict = field(default_factory=dict)
    kernels: int = 0
    symbolic: str = ""      # frontend "torch-dynamic": "symbolic", "per-size" or ""

    def line(self) -> str:
        extra = f" fallbacks={self.fallback_ops}" if self.fallback_ops else ""
        return (f"{self.op} [{self.dtype} #{self.sample} {self.variant}] {self.category}"
                f"{extra}{': ' + self.detail if self.detail else ''}")


def _short(e: BaseException, limit: int = 400) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text if len(text) <= limit else text[:limit] + "..."


FRONTENDS = ("ember", "torch", "torch-dynamic")


def _compile(fn, counter, frontend: str):
    """``fn`` compiled by Ember's frontend, or by torch.compile's with static sizes or with
    every size symbolic (``dynamic=True``: the graphs Ember's backend gets carry SymInts)."""
    if frontend == "ember":
        return ember.compile(fn, backend=counter)
    if frontend not in FRONTENDS:
        raise ValueError(f"frontend must be one of {FRONTENDS}, got {frontend!r}")
    torch.compiler.reset()
    return torch.compile(fn, backend=counter, dynamic=frontend == "torch-dynamic")


def run_sample(op, callable_, sample, dtype, index: int = 0, variant: str = "out-of-place",
               backend=None, cpu_backend: str = "cpp", frontend: str = "ember") -> Outcome:
    """One sample's outcome; ``backend`` replaces the "ember" backend (the harness's own
    tests); ``frontend``: one of ``FRONTENDS``."""
    name = op_full_name(op)
    dname = str(dtype).replace("torch.", "")

    def outcome(category, detail="", **kw):
        return Outcome(name, dname, index, variant, category, detail, **kw)

    try:
        fn, tensors, problem = build_function(callable_, sample)
    except Exception as e:
        return outcome("skip", f"cannot build the function: {_short(e)}")
    if problem:
        return outcome("skip", problem)
    src = fn.__opinfo_src__.splitlines()[1].strip()
    random_op = draws_random(name, sample)
    uninitialized = bool(_name_words(name) & _UNINITIALIZED_WORDS)

    eager_inputs = [copy_tensor(t) for t in tensors]
    compiled_inputs = [copy_tensor(t) for t in tensors]

    torch.manual_seed(1234)
    try:
        expected = fn(*eager_inputs)
    except Exception as e:
        return outcome("skip", f"eager raised {_short(e, 150)}")
    problem = _has_complex_or_sparse(expected)
    if problem:
        return outcome("skip", problem)

    ember.reset()
    compile_stats.reset()
    counter = _CountingBackend(backend, cpu_backend)
    compiled_fn = _compile(fn, counter, frontend)
    torch.manual_seed(1234)
    try:
        actual = compiled_fn(*compiled_inputs)
    except Exception as e:
        tb = traceback.format_exc(limit=-3).strip().splitlines()
        where = tb[-3].strip() if len(tb) >= 3 else ""
        return outcome("fail", f"compiled raised {_short(e)} ({where}) in `{src}`")
    eager_reason = getattr(compiled_fn, "_eager_reason", None)
    if eager_reason is None and ember.metrics.counters["frontend"]["frames_eager"]:
        eager_reason = "a frame the graph broke into ran eagerly"
    fallbacks = dict(compile_stats.fallback_ops)
    kernels = compile_stats.generated_kernel_count
    symbolic = "per-size" if compile_stats.size_specializations else \
        "symbolic" if compile_stats.symbolic_compiles else ""

    tol = float_tolerance(op, dtype) if dtype.is_floating_point else None
    if dtype in HALF_TOLERANCE:   # eager rounds each op, Ember only what it stores
        floor = HALF_TOLERANCE[dtype]
        tol = floor if tol is None else (max(tol[0], floor[0]), max(tol[1], floor[1]))
    try:
        if uninitialized:
            _assert_meta_equal(actual, expected)
        else:
            try:
                assert_same(actual, expected, tol)
            except AssertionError:
                if not random_op:
                    raise
                _assert_meta_equal(actual, expected)
        for i, (a, e) in enumerate(zip(compiled_inputs, eager_inputs)):
            try:
                assert_same(a, e, tol)
            except AssertionError as err:
                if random_op:       # an in-place random op (dropout_): its draws differ
                    _assert_meta_equal(a, e)
                    continue
                raise AssertionError(f"input t{i} after the call differs (mutation): {err}")
    except AssertionError as e:
        return outcome("fail", f"mismatch in `{src}`: {_short(e)}",
                       fallback_ops=fallbacks, kernels=kernels, symbolic=symbolic)

    if counter.frame_count == 0:
        if eager_reason is not None:
            return outcome("frontend-eager", str(eager_reason)[:300])
        return outcome("no-graph")
    if fallbacks:
        return outcome("fallback", fallback_ops=fallbacks, kernels=kernels, symbolic=symbolic)
    if kernels > 0:
        return outcome("kernel", kernels=kernels, symbolic=symbolic)
    return outcome("eager-graph", f"{counter.op_count} ops", symbolic=symbolic)


def _call_plainly(op, *args, **kwargs):
    return op(*args, **kwargs)


def without_seed_wrapper(callable_):
    """OpInfo wraps random ops as ``lambda ...: wrapper_set_seed(torch.x, ...)``, which seeds
    inside ``freeze_rng_state()`` (test machinery the frontend need not capture). The harness
    seeds the RNG identically before the eager and the compiled run, so the same lambda is
    rebuilt with ``wrapper_set_seed`` bound to a plain call."""
    code = getattr(callable_, "__code__", None)
    if not isinstance(callable_, types.FunctionType) or "wrapper_set_seed" not in code.co_names:
        return callable_
    fn_globals = dict(callable_.__globals__, wrapper_set_seed=_call_plainly)
    new = types.FunctionType(code, fn_globals, callable_.__name__, callable_.__defaults__,
                             callable_.__closure__)
    new.__kwdefaults__ = callable_.__kwdefaults__
    return new


def run_op(op, cpu_backend: str = "cpp", device: str = "cpu",
           dtypes: tuple = DTYPES, ci_samples: int = 2,
           frontend: str = "ember") -> list[Outcome]:
    """Every selected dtype, variant and sample of one OpInfo, on ``device``
    (``ci_samples`` per (op, dtype) in CI mode; ``frontend``: one of ``FRONTENDS``)."""
    k = samples_per_op()
    if k == 2 and not full_mode() and not os.environ.get("EMBER_OPINFO_K"):
        k = ci_samples
    name = op_full_name(op)
    try:
        supported = op.supported_dtypes(device)
    except Exception:
        supported = set()
    variants = [("out-of-place", without_seed_wrapper(op.op))]
    if full_mode() and op.inplace_variant is not None:
        variants.append(("inplace", without_seed_wrapper(op.inplace_variant)))
    results: list[Outcome] = []
    for dtype in dtypes:
        if dtype not in supported:
            continue
        for variant, callable_ in variants:
            torch.manual_seed(0)
            try:
                samples = op.sample_inputs(device, dtype, requires_grad=False)
                index = 0
                for sample in samples:
                    if k is not None and index >= k:
                        break
                    results.append(run_sample(op, callable_, sample, dtype, index, variant,
                                              cpu_backend=cpu_backend, frontend=frontend))
                    index += 1
            except Exception as e:
                results.append(Outcome(name, str(dtype).replace("torch.", ""), -1, variant,
                                       "skip", f"sample generation raised {_short(e, 150)}"))
    ember.reset()
    return results


# ---------------------------------------------------------------------- totals

TARGET_NAMES = {"cpp": "C++", "triton": "Triton interpreter", "cpp-float16": "C++ float16",
                "cpp-bfloat16": "C++ bfloat16", "cuda-float32": "CUDA float32",
                "cuda-float16": "CUDA float16", "cuda-bfloat16": "CUDA bfloat16"}
# (rtol, atol) at least, for half precision: eager rounds after every op of a composite,
# fused kernels compute in float32 and round once
HALF_TOLERANCE = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}
# target -> {op full name: its outcomes}
RESULTS: "dict[str, collections.OrderedDict[str, list[Outcome]]]" = {
    t: collections.OrderedDict() for t in TARGET_NAMES}


def totals(cpu_backend: str = "cpp") -> dict[str, int]:
    counts = dict.fromkeys(CATEGORIES, 0)
    for outcomes in RESULTS[cpu_backend].values():
        for o in outcomes:
            counts[o.category] = counts.get(o.category, 0) + 1
    return counts


def summary_line(cpu_backend: str = "cpp") -> str:
    counts = totals(cpu_backend)
    body = " / ".join(f"{k} {v}" for k, v in counts.items())
    mode = "full" if full_mode() else "ci"
    return (f"ember OpInfo conformance, {TARGET_NAMES[cpu_backend]} ({mode}, "
            f"{len(RESULTS[cpu_backend])} ops, {sum(counts.values())} samples): {body}")


def write_report(path: str) -> None:
    """C++ totals and outcomes at the top level (``"totals"``, ``"ops"``); the Triton
    interpreter's, if it ran, under ``"triton"`` in the same form."""
    import json

    def part(target):
        return {"totals": totals(target), "ops": {
            name: [o.__dict__ for o in outs] for name, outs in RESULTS[target].items()}}
    data = {"mode": "full" if full_mode() else "ci", **part("cpp")}
    for target in TARGET_NAMES:
        if target != "cpp" and RESULTS[target]:
            data[target] = part(target)
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)
