"""AMP training steps of BERT-base and GPT-2 with dropout 0.1 on the GPU (issue 10: the
backward draws dropout's masks again from the saved generator state, ``ember/aot/rng.py``):
Ember against eager under the same seed. Per model: the median over parameters of the
relative gradient error against eager, and the same error of eager against itself under
another seed (what wrong masks would cost); then the largest of each (random-weight BERT's
key biases have gradients that are rounding noise, zero in exact arithmetic: their relative
error is about 1 however the masks are drawn, so the median is the verdict), the gradient
elements zero in one and not the other, step time and peak memory.

    PYTHONPATH=. python3 benchmarks/dropout_train.py [bert_base gpt2]
"""
import statistics, sys, time
import torch, torch.nn as nn
import ember
from ember.bench import zoo
from ember.bench.harness import _loss


def step(f, inputs, params, seed):
    for p in params:
        p.grad = None
    torch.manual_seed(seed)
    _loss(f(*inputs)).backward()
    return [p.grad.float().clone() for p in params]


def relative_errors(got, want) -> list[float]:
    """Per parameter, the norm of the gradient's difference over the norm of eager's."""
    return [((g - w).norm() / max(w.norm(), 1e-12)).item() for g, w in zip(got, want)]


for name in sys.argv[1:] or ["bert_base", "gpt2"]:
    fn, inputs = zoo.build_model(name, "cuda", mode="train", amp=torch.bfloat16)
    n = 0
    for m in fn.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.1
            n += 1
    params = [p for p in fn.parameters() if p.requires_grad]
    compiled = ember.compile(fn)
    t0 = time.perf_counter()
    step(compiled, inputs, params, 0)
    torch.cuda.synchronize()
    cold = time.perf_counter() - t0
    errs = []
    for seed in (1, 2):
        want = step(fn, inputs, params, seed)
        got = step(compiled, inputs, params, seed)
        rel = relative_errors(got, want)
        zeros = sum(int(((g == 0) != (w == 0)).sum()) for g, w in zip(got, want))
        other = step(fn, inputs, params, seed + 100)    # what other masks would give
        other_rel = relative_errors(other, want)
        errs.append(f"median {statistics.median(rel):.4f} (other seed "
                    f"{statistics.median(other_rel):.3f}), max {max(rel):.3f} (other seed "
                    f"{max(other_rel):.3f}), zero mismatches {zeros}")
    res = {}
    for label, f in (("eager", fn), ("ember", compiled)):
        for _ in range(3):
            step(f, inputs, params, 0)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        ts = []
        for i in range(10):
            t = time.perf_counter()
            step(f, inputs, params, i)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        res[label] = (statistics.median(ts) * 1e3, (torch.cuda.max_memory_allocated() - base) / 2**20)
    print(f"{name}: {n} dropouts p=0.1, compile {cold:.1f}s, grad rel err {'; '.join(errs)}; "
          f"eager {res['eager'][0]:.2f} ms {res['eager'][1]:.0f} MiB; ember {res['ember'][0]:.2f} ms "
          f"{res['ember'][1]:.0f} MiB; speedup {res['eager'][0]/res['ember'][0]:.2f}x", flush=True)
    ember.reset()
