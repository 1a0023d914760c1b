"""Where a model's GPU time goes: eager, Ember and torch.compile side by side, with the top
kernels of each (issue 34's profiles of the models Ember trails torch.compile on).

    PYTHONPATH=. python3 benchmarks/profile_models.py vgg16_bn,MistralForCausalLM \\
        [--layout auto[,channels_last]] [--no-torch-compile] [--eager] [--rows 12] \\
        [--dtype bfloat16] [--mode reduce-overhead] [--dynamic] [--train] \\
        [--compile-budget 150] [--out FILE]

Models come from the bench zoo (``ember/bench/zoo/``) at their default CUDA batch, in
bfloat16 as the GPU library runs measure them (``--dtype float32``: the zoo's own dtype),
``eval()`` under ``no_grad``; ``--train``: a training step instead (float32 weights under
autocast to ``--dtype``, forward, the bench's loss and backward, dropout off). In one process, one variant after another: eager, Ember once per
``--layout`` value (``config.layout_optimization``; an option change drops Ember's compiled
code, so each layout is compiled, timed and profiled before the next), and torch.compile in
its default mode. ``--torch-compile`` is on by default, since the point is to set Ember beside
torch.compile; ``--no-torch-compile`` leaves it out (and never imports torch._dynamo).

Each variant gets: its first call's seconds (compile), the median of ``--iters`` calls
(CUDA events; host time beside it: close to the GPU time means CPU-bound), its relative error
against eager's output (rms of the difference over rms of eager's, worst output), the kernels
it launches per call and the GPU's busy time per call, and its top ``--rows`` kernels by total
CUDA time over ``--profile-iters`` calls (torch.profiler; memcpy and memset count as
launches). ``--eager`` profiles eager's kernels too.

A model or a variant that fails (out of memory, a compile error, a first call over
``--compile-budget`` seconds) is reported as such and the script moves on. ``--out FILE``
writes the markdown report, rewritten after each model, so a run killed by a timeout keeps
what it measured. ``--device cpu`` (with ``--batch-size``) is a smoke test of the script: wall
times, and CPU ops (nested ones included) instead of kernels. ``EMBER_LOGS=perf_hints`` adds
the compiler's decisions (layout, CUDA graphs, autotuning) to the log.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import platform
import sys
import time
import traceback

import torch
from torch.profiler import ProfilerActivity, profile

import ember
from ember import config
from ember.backend import compile_stats
from ember.bench import accuracy, harness, zoo


@dataclasses.dataclass
class Kernel:
    name: str
    ms: float        # total time per call
    calls: float     # launches per call


@dataclasses.dataclass
class Variant:
    label: str
    ms: float | None = None
    host_ms: float | None = None
    compile_s: float | None = None
    error: float | None = None       # relative error against eager's output
    launches: float | None = None    # kernels launched per call
    busy_ms: float | None = None     # summed kernel time per call
    kernels: list[Kernel] = dataclasses.field(default_factory=list)
    failure: str | None = None


@dataclasses.dataclass
class ModelResult:
    name: str
    inputs: str = ""
    variants: list[Variant] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    failure: str | None = None

    def variant(self, label: str) -> Variant | None:
        return next((v for v in self.variants if v.label == label), None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", help="comma-separated zoo model names")
    parser.add_argument("--layout", default="auto",
                        help="Ember's layout_optimization, or several comma-separated (one "
                             "Ember variant each): auto, channels_last, off")
    parser.add_argument("--torch-compile", action=argparse.BooleanOptionalAction, default=True,
                        help="profile torch.compile (default mode) too (default: on)")
    parser.add_argument("--eager", action="store_true", help="profile eager's kernels too")
    parser.add_argument("--mode", default=None, help="Ember's mode (default: its default)")
    parser.add_argument("--dynamic", action="store_true",
                        help="one more Ember variant per layout, compiled with dynamic=True "
                             "(every size symbolic: issue 31's dynamic against static kernels)")
    parser.add_argument("--train", action="store_true",
                        help="profile an AMP training step (float32 weights, autocast to "
                             "--dtype, forward + loss + backward) instead of inference")
    parser.add_argument("--rows", type=int, default=12, help="top kernels shown per variant")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(zoo.DTYPES))
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu: a smoke test of the script")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="default: each model's own for the device")
    parser.add_argument("--iters", type=int, default=20, help="timed calls (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before them")
    parser.add_argument("--profile-iters", type=int, default=3, help="calls profiled")
    parser.add_argument("--compile-budget", type=float, default=150.0,
                        help="seconds a compiler's first call may take (0: no limit)")
    parser.add_argument("--out", default=None, help="also write the markdown report here")
    args = parser.parse_args(argv)
    args.layouts = args.layout.split(",")
    for layout in args.layouts:
        if layout not in ("auto", "channels_last", "off"):
            parser.error(f"--layout: unknown layout {layout!r} (auto, channels_last, off)")
    return args


def ember_variants(args: argparse.Namespace) -> list[tuple[str, bool]]:
    """(layout, dynamic) of each Ember variant, in the order they run."""
    return [(layout, dynamic) for layout in args.layouts
            for dynamic in ((False, True) if args.dynamic else (False,))]


def ember_label(layout: str, dynamic: bool, args: argparse.Namespace) -> str:
    label = "ember" if len(args.layouts) == 1 else f"ember ({layout})"
    return f"{label} dynamic" if dynamic else label


def profile_model(name: str, args: argparse.Namespace) -> ModelResult:
    """Every variant of model ``name``; failures are recorded, never raised."""
    result = ModelResult(name)
    device = torch.device(args.device)
    try:
        dtype = zoo.DTYPES[args.dtype]
        model, inputs = zoo.build_model(name, device, dtype=None if args.train else dtype,
                                        batch_size=args.batch_size,
                                        mode="train" if args.train else "infer",
                                        amp=dtype if args.train else None)
    except Exception as e:
        result.failure = f"building failed: {_one_line(e)}"
        traceback.print_exc()
        return result
    result.inputs = ", ".join(harness.describe(t) for t in inputs)
    try:
        with contextlib.nullcontext() if args.train else torch.no_grad():
            _profile_variants(model, inputs, device, args, result)
    except Exception as e:    # eager itself failed (out of memory at this batch, say)
        result.failure = _one_line(e)
        traceback.print_exc()
    finally:
        del model, inputs
        ember.reset()
        if args.torch_compile:
            torch.compiler.reset()
        _free(device)
    return result


def _profile_variants(model, inputs, device, args, result: ModelResult) -> None:
    eager = Variant("eager")
    result.variants.append(eager)
    start = time.perf_counter()
    reference = model(*inputs)
    _sync(device)
    eager.compile_s = time.perf_counter() - start
    _measure(eager, model, inputs, device, args, reference, with_kernels=args.eager)

    for layout, dynamic in ember_variants(args):
        variant = Variant(ember_label(layout, dynamic, args))
        result.variants.append(variant)
        ember.reset()
        compile_stats.reset()
        try:
            with config.patch(layout_optimization=layout):
                compiled = ember.compile(model, mode=args.mode, dynamic=dynamic or None)
                _first_call(variant, compiled, inputs, device, args)
                _measure(variant, compiled, inputs, device, args, reference)
                result.notes.append(
                    f"{variant.label}: {compile_stats.generated_kernel_count} generated "
                    f"kernels; library calls {dict(compile_stats.extern_calls)}; eager "
                    f"fallbacks {dict(compile_stats.fallback_ops)}")
        except Exception as e:
            _fail(variant, e)
        finally:
            compiled = None
            ember.reset()
            _free(device)

    if args.torch_compile:
        variant = Variant("torch.compile")
        result.variants.append(variant)
        peer = None
        try:
            notes: list[str] = []
            peer = harness.compile_peer(model, inputs, device, args.compile_budget or None,
                                        notes)
            if peer is None:
                variant.failure = "; ".join(notes)
            else:
                compiled, variant.compile_s, out = peer
                variant.error = _relative_error(out, reference)
                del out
                _measure(variant, compiled, inputs, device, args, reference)
        except Exception as e:
            _fail(variant, e)
        finally:
            compiled = peer = None
            torch.compiler.reset()
            _free(device)


def _first_call(variant: Variant, fn, inputs, device, args) -> None:
    """Compile by calling ``fn`` once, within the budget; a budget overrun raises
    RuntimeError."""
    try:
        with harness._time_limit(args.compile_budget or None):
            variant.compile_s, _ = harness._timed_call(fn, inputs, device)
    except BaseException as e:
        if harness._caused_by_budget(e):
            raise RuntimeError(f"first call took over {args.compile_budget:g} s") from None
        raise


def _measure(variant: Variant, fn, inputs, device, args, reference,
             with_kernels: bool = True) -> None:
    if args.train:
        step = harness._Step(fn, inputs, "train", harness._trainable(fn))   # the bench's
        fn = lambda *_: step()      # noqa: E731   (forward, loss, backward)
    if variant.error is None:
        variant.error = _relative_error(fn(*inputs), reference)
    timed = harness.time_calls({variant.label: lambda: fn(*inputs)}, device, args.iters,
                               args.warmup)
    variant.ms, variant.host_ms = timed[variant.label]
    if with_kernels:
        variant.kernels, variant.launches, variant.busy_ms = kernel_profile(
            fn, inputs, device, args.profile_iters, args.rows)
    print(f"  {variant.label}: {variant.ms:.3f} ms (host {variant.host_ms:.3f} ms)"
          + (f", {variant.launches:.0f} launches/call" if variant.launches is not None else ""),
          flush=True)


def median_ms(fn, *args, iters: int = 20, warmup: int = 3, device: str = "cuda") -> float:
    """Median milliseconds of ``fn(*args)`` (CUDA events on a GPU; for the small benchmark
    scripts)."""
    return harness.time_calls({"fn": lambda: fn(*args)}, torch.device(device), iters,
                              warmup)["fn"][0]


def kernel_profile(fn, inputs, device: torch.device, iters: int, rows: int
                   ) -> tuple[list[Kernel], float, float]:
    """(top ``rows`` kernels by total time, launches per call, busy ms per call) over
    ``iters`` profiled calls. On the CPU: ATen ops by self time, nested ones included."""
    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            fn(*inputs)
        _sync(device)
    # user annotations (record_function ranges such as torch.compile's "## Call
    # CompiledFxGraph ##") span kernels on the GPU's timeline: counting them counts twice
    events = [e for e in prof.key_averages() if not getattr(e, "is_user_annotation", False)]
    if cuda:
        on_device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        events = on_device or [e for e in events if e.self_device_time_total > 0]
    else:
        events = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    kernels = [Kernel(e.key, (e.self_device_time_total if cuda else e.self_cpu_time_total)
                      / iters / 1e3, e.count / iters) for e in events]
    kernels.sort(key=lambda k: -k.ms)
    return (kernels[:rows], sum(k.calls for k in kernels), sum(k.ms for k in kernels))


def _relative_error(out, reference) -> float:
    return max(accuracy.relative_errors(out, reference), default=0.0)


def _fail(variant: Variant, e: BaseException) -> None:
    variant.failure = _one_line(e)
    traceback.print_exc()


def _free(device: torch.device) -> None:
    """Give the caching allocator's blocks back (after an out-of-memory failure above all)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------- the markdown report

def _num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den == 0 else num / den


def _cell_name(name: str, width: int = 90) -> str:
    name = name if len(name) <= width else name[:width - 3] + "..."
    return "`" + name.replace("`", "'").replace("|", "/") + "`"


def header(args: argparse.Namespace) -> str:
    if args.device == "cuda" and torch.cuda.is_available():
        where = torch.cuda.get_device_name()
    else:
        where = f"CPU ({platform.processor() or platform.machine()})"
    timing = "CUDA events" if args.device == "cuda" else "wall time"
    return (f"# Eager, Ember and torch.compile: times and top kernels\n\n"
            f"{where}; torch {torch.__version__}; {args.dtype}"
            f"{' AMP training step' if args.train else ''}; Ember layout "
            f"{args.layout}, mode {args.mode or 'default'}; torch.compile "
            f"{'default mode' if args.torch_compile else 'not run'}; median of {args.iters} "
            f"calls ({timing}) after {args.warmup}; kernels over {args.profile_iters} calls.\n")


def summary_table(results: list[ModelResult], args: argparse.Namespace) -> str:
    embers = [ember_label(layout, dynamic, args) for layout, dynamic in ember_variants(args)]
    compiled = embers + ["torch.compile"] * args.torch_compile
    cols = (["model", "inputs", "eager ms"] + [f"{v} ms" for v in compiled]
            + [f"{v} vs eager" for v in compiled]
            + [f"{v} / torch.compile" for v in embers if args.torch_compile]
            + [f"{v} launches/call" for v in compiled] + [f"{v} compile s" for v in compiled])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in results:
        if r.failure is not None:
            lines.append(f"| {r.name} | {r.inputs or 'n/a'} | failed: {r.failure} |")
            continue
        eager = r.variant("eager")
        variants = {label: r.variant(label) or Variant(label) for label in compiled}
        tc = variants.get("torch.compile")
        cells = [r.name, r.inputs, _num(eager.ms, 3)]
        cells += [_num(v.ms, 3) for v in variants.values()]
        cells += [_num(_ratio(eager.ms, v.ms)) + ("x" if v.ms else "")
                  for v in variants.values()]
        if args.torch_compile:
            cells += [_num(_ratio(tc.ms, variants[e].ms)) for e in embers]
        cells += [_num(v.launches, 0) for v in variants.values()]
        cells += [_num(v.compile_s, 1) for v in variants.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def model_section(r: ModelResult, args: argparse.Namespace) -> str:
    what = "CUDA kernels" if args.device == "cuda" else "CPU ops (self time, nested included)"
    out = [f"## {r.name} ({r.inputs or 'not built'})\n"]
    if r.failure is not None:
        out.append(f"failed: {r.failure}\n")
    if not r.variants:
        return "\n".join(out)
    eager_ms = r.variants[0].ms
    out += ["| variant | ms | host ms | vs eager | rel. error vs eager | first call s | "
            "launches/call | busy ms/call | failure |", "|---|---|---|---|---|---|---|---|---|"]
    for v in r.variants:
        out.append(f"| {v.label} | {_num(v.ms, 3)} | {_num(v.host_ms, 3)} | "
                   f"{_num(_ratio(eager_ms, v.ms))} | "
                   f"{'n/a' if v.error is None else f'{v.error:.2e}'} | "
                   f"{_num(v.compile_s, 1)} | {_num(v.launches, 0)} | {_num(v.busy_ms, 3)} | "
                   f"{v.failure or ''} |")
    shown = [v for v in r.variants if v.kernels]
    if shown:
        out.append(f"\nTop {args.rows} {what} by time per call (ms per call, launches per "
                   f"call):\n")
        cols = ["#"] + [c for v in shown for c in (v.label, "ms", "n")]
        out += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for i in range(max(len(v.kernels) for v in shown)):
            cells = [str(i + 1)]
            for v in shown:
                k = v.kernels[i] if i < len(v.kernels) else None
                cells += ([_cell_name(k.name), f"{k.ms:.3f}", f"{k.calls:g}"] if k
                          else ["", "", ""])
            out.append("| " + " | ".join(cells) + " |")
    if r.notes:
        out.append("")
        out += [f"- {note}" for note in r.notes]
    return "\n".join(out) + "\n"


def report(results: list[ModelResult], args: argparse.Namespace) -> str:
    return "\n".join([header(args), "## Summary\n", summary_table(results, args)]
                     + [model_section(r, args) for r in results])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: pass --device cpu for a smoke test", file=sys.stderr)
        return 2
    results: list[ModelResult] = []
    for name in args.models.split(","):
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        results.append(profile_model(name, args))
        print(model_section(results[-1], args), flush=True)
        print(f"({name}: {time.perf_counter() - start:.0f} s)", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                f.write(report(results, args))
    print(summary_table(results, args), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
