"""AMP gradient accuracy: eager, Ember and torch.compile against a float32 reference.

    HF_HUB_OFFLINE=1 PYTHONPATH=. python3 benchmarks/amp_accuracy.py              # CUDA
    PYTHONPATH=. python benchmarks/amp_accuracy.py --device cpu                   # smoke test

For each model (random weights, built from configs): one step of
``out.float().pow(2).mean().backward()`` with the forward under
``torch.autocast(device, torch.bfloat16)`` (float32 weights), and the same step in float32
without autocast (the reference). Each parameter's gradient error is
``||grad - grad_ref|| / ||grad_ref||``; per compiler the script prints the median and the
largest error over the parameters, and how many parameters are more than 3x eager's error
(+1e-4) off (Ember's AMP accuracy test allows no such parameter).

Models: ``layernorm`` (``nn.LayerNorm(768)`` alone), ``vit`` (timm ``vit_base_patch16_224``),
``gpt2`` (transformers ``GPT2Model``, GPT-2 small's config). Dropout is off (eval mode), so
the compilers run the same computation. ``--small`` (the default on the CPU) shrinks ViT and
GPT-2 to two blocks of width 64, which Ember compiles in seconds on a CPU.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

MULTIPLIER, FLOOR = 3.0, 1e-4


def build(name: str, device: str, small: bool):
    torch.manual_seed(0)
    if name == "layernorm":
        return torch.nn.LayerNorm(768), (torch.randn(8, 197, 768),)
    if name == "vit":
        from ember.bench.compat import import_timm
        timm = import_timm()
        if timm is None:
            raise RuntimeError("timm is not installed")
        kwargs = dict(embed_dim=64, depth=2, num_heads=4, img_size=32, patch_size=8) \
            if small else {}
        model = timm.create_model("vit_base_patch16_224", pretrained=False, **kwargs)
        size = 32 if small else 224
        return model, (torch.randn(2 if small else 8, 3, size, size),)
    if name == "gpt2":
        from ember.bench.compat import import_transformers
        transformers = import_transformers()
        if transformers is None:
            raise RuntimeError("transformers is not installed")
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128) \
            if small else transformers.GPT2Config()
        model = transformers.GPT2Model(config)
        seq = 32 if small else 256
        return model, (torch.randint(0, config.vocab_size, (2 if small else 4, seq)),)
    raise ValueError(f"unknown model {name!r}")


def first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    return out[0]


def loss_of(out: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "square":
        return out.float().pow(2).mean()
    # a final LayerNorm's outputs have a constant sum of squares per row: through it the
    # square loss has gradients of about eps/var of their terms (GPT2Model ends in ln_f),
    # whose computed values are mostly rounding; weights along the last dim avoid that
    return (out.float() * torch.linspace(-1, 1, out.shape[-1], device=out.device)).mean()


def gradients(model, inputs, device, compiler, amp: bool,
              loss: str = "square") -> dict[str, torch.Tensor]:
    m = copy.deepcopy(model)
    fn = compiler(m) if compiler is not None else m
    with torch.autocast(device, torch.bfloat16, enabled=amp):
        out = first_tensor(fn(*inputs))
    loss_of(out, loss).backward()
    return {n: p.grad.detach().float().clone() for n, p in m.named_parameters()
            if p.grad is not None}


def compilers(names: list[str]):
    import ember
    table = {"eager": None,
             "ember": lambda m: ember.compile(m),
             "ember-triton": lambda m: ember.compile(m, options={"cpu_backend": "triton"}),
             "ember-aot_eager": lambda m: ember.compile(m, backend="aot_eager"),
             "torch.compile": lambda m: torch.compile(m)}
    unknown = set(names) - set(table)
    if unknown:
        raise SystemExit(f"unknown compilers {sorted(unknown)}; known: {', '.join(table)}")
    return {n: table[n] for n in names}


def errors(grads, ref) -> dict[str, float]:
    out = {}
    for name, r in ref.items():
        g = grads.get(name)
        out[name] = float("inf") if g is None else \
            ((g - r).norm() / r.norm().clamp_min(1e-30)).item()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--models", default="layernorm,vit,gpt2")
    parser.add_argument("--compilers", default=None,
                        help="comma-separated: eager, ember, ember-triton (the Triton target on the CPU), "
                             "ember-aot_eager, torch.compile "
                             "(default: eager,ember,torch.compile on CUDA, eager,ember,"
                             "ember-aot_eager on the CPU)")
    parser.add_argument("--small", action="store_true", default=None,
                        help="two-block ViT/GPT-2 of width 64 (default on the CPU)")
    parser.add_argument("--full", dest="small", action="store_false")
    parser.add_argument("--loss", default="square", choices=["square", "weighted"],
                        help="square: out.float().pow(2).mean() (default); weighted: "
                             "(out.float() * linspace(-1, 1)).mean(), whose gradients through "
                             "a final LayerNorm are not near zero")
    args = parser.parse_args(argv)
    device = args.device
    small = (device == "cpu") if args.small is None else args.small
    names = (args.compilers or ("eager,ember,torch.compile" if device == "cuda" else
                                "eager,ember,ember-aot_eager")).split(",")
    if "eager" not in names:
        names.insert(0, "eager")
    print(f"torch {torch.__version__}, device {device}"
          f"{' (' + torch.cuda.get_device_name() + ')' if device == 'cuda' else ''}, "
          f"autocast bfloat16, {'small' if small else 'full-size'} models, {args.loss} loss")
    worst = 0
    for model_name in args.models.split(","):
        try:
            model, inputs = build(model_name, device, small)
        except Exception as e:
            print(f"{model_name}: not built ({type(e).__name__}: {e})")
            continue
        model = model.to(device).eval()
        inputs = tuple(t.to(device) for t in inputs)
        ref = gradients(model, inputs, device, None, amp=False, loss=args.loss)
        per: dict[str, dict[str, float]] = {}
        for cname, compiler in compilers(names).items():
            start = time.perf_counter()
            try:
                per[cname] = errors(gradients(model, inputs, device, compiler, amp=True,
                                              loss=args.loss), ref)
            except Exception as e:
                print(f"{model_name:10s} {cname:16s} failed: {type(e).__name__}: {e}")
                continue
            finally:
                if cname == "torch.compile":
                    torch.compiler.reset()
            errs = sorted(per[cname].values())
            eager = per.get("eager", {})
            over = [n for n, e in per[cname].items()
                    if n in eager and e > MULTIPLIER * eager[n] + FLOOR]
            worst = max(worst, len(over)) if cname.startswith("ember") else worst
            print(f"{model_name:10s} {cname:16s} {len(errs):4d} params  median "
                  f"{statistics.median(errs):.2e}  max {errs[-1]:.2e}  "
                  f"over 3x eager: {len(over):3d}"
                  f"{' (e.g. ' + over[0] + ')' if over else ''}  "
                  f"[{time.perf_counter() - start:.1f} s]", flush=True)
        if "eager" in per and "ember" in per:
            ratios = sorted(per["ember"][n] / max(per["eager"][n], 1e-12)
                            for n in per["eager"] if per["eager"][n] > 0)
            if ratios:
                print(f"{model_name:10s} ember/eager error ratio per parameter: median "
                      f"{statistics.median(ratios):.2f}, max {ratios[-1]:.2f}")
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
