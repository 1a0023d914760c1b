"""DistributedDataParallel training step: eager, torch.compile and Ember, with how much of the
gradient all-reduce the backward hides (issue 33).

For each model (GPT-2 small, HF ``GPT2Model``; torchvision resnet50) and variant (eager DDP,
``torch.compile(ddp)``, ``ember.compile(ddp)``, and Ember with ``config.split_ddp_graphs``
off, the control), every rank trains with SGD and reports, on rank 0:

- ``step``: median wall time of forward + backward + optimizer step (synchronised);
- ``compute``: the same step under ``ddp.no_sync()`` (no all-reduce at all);
- ``comm``: the all-reduces alone, replayed on buffers of the sizes DDP's buckets had in the
  step (recorded by a comm hook), one after another;
- ``hidden``: the share of ``comm`` the step does not pay, ``1 - (step - compute) / comm``
  (clamped to [0, 1]): 0 when every all-reduce waits for the whole backward;
- ``first``: when the first bucket's all-reduce was launched, as a share of the backward
  (from its start until ``backward()`` returns, waiting for the last all-reduce included;
  CUDA events on the compute stream, the host clock on the CPU): near 100% when it waits for
  the whole backward, early when the graph is cut;
- ``graphs``: the graphs Ember compiled (a cut graph counts each piece).

On GPUs (NCCL; bfloat16 autocast, float32 weights; DDP's default 25 MiB buckets):

    PYTHONPATH=. python benchmarks/ddp_overlap.py --nprocs 8
    PYTHONPATH=. torchrun --nproc-per-node 8 benchmarks/ddp_overlap.py

On the CPU (gloo, 2 processes, small models (4 and 30 MB of parameters) and 1 MiB buckets;
checks the script runs; torch.compile's DDP support refuses buckets under 1 MiB):

    PYTHONPATH=. python benchmarks/ddp_overlap.py --smoke
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

VARIANTS = ("eager", "torch.compile", "ember", "ember-uncut")


def _gpt2(smoke: bool, device) -> tuple[nn.Module, tuple]:
    from ember.bench import compat
    transformers = compat.import_transformers()
    if smoke:
        config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=2, vocab_size=4096,
                                         n_positions=64, use_cache=False, bos_token_id=0,
                                         eos_token_id=0)
        batch, length = 2, 32
    else:
        config = transformers.GPT2Config(use_cache=False)    # GPT-2 small, 124M parameters
        batch, length = 8, 512
    for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
        setattr(config, name, 0.0)
    model = transformers.GPT2Model(config)
    return model, (torch.randint(0, config.vocab_size, (batch, length), device=device),)


def _resnet50(smoke: bool, device) -> tuple[nn.Module, tuple]:
    from ember.bench import compat
    models = compat.import_torchvision().models
    if smoke:   # resnet50's bottleneck blocks, one per stage, on 32x32 images
        model = models.resnet.ResNet(models.resnet.Bottleneck, [1, 1, 1, 1], num_classes=10)
        return model, (torch.randn(2, 3, 32, 32, device=device),)
    return models.resnet50(weights=None), (torch.randn(64, 3, 224, 224, device=device),)


MODELS = {"gpt2": _gpt2, "resnet50": _resnet50}


class _Autocast(nn.Module):
    def __init__(self, model: nn.Module, device_type: str):
        super().__init__()
        self.model, self.device_type = model, device_type

    def forward(self, *args):
        with torch.autocast(self.device_type, dtype=torch.bfloat16):
            return self.model(*args)


def _wrap(variant: str, model: nn.Module, bucket_cap_mb, device, backend):
    """(what a step calls, the DDP) for ``variant``; Ember compiles with ``backend``."""
    import ember
    from torch.nn.parallel import DistributedDataParallel as DDP
    kwargs = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    ddp = DDP(model, device_ids=[device] if device.type == "cuda" else None, **kwargs)
    if variant == "eager":
        return ddp, ddp
    if variant == "torch.compile":
        return torch.compile(ddp), ddp
    return ember.compile(ddp, backend=backend), ddp


class _Clock:
    """Points in time: CUDA events on the current stream (what the GPU has reached when the
    host records them), or the host clock."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ms(self, start, end) -> float:
        """Milliseconds from ``start`` to ``end`` (after a synchronisation)."""
        return start.elapsed_time(end) if self.cuda else 1e3 * (end - start)


class _Buckets:
    """A comm hook that all-reduces (averaging) and records each bucket's size and launch."""

    def __init__(self, clock: _Clock):
        self.clock = clock
        self.sizes: list[int] = []
        self.launches: list = []

    def hook(self, state, bucket):
        self.launches.append(self.clock.now())
        buffer = bucket.buffer()
        self.sizes.append(buffer.numel())
        buffer.div_(dist.get_world_size())
        fut = dist.all_reduce(buffer, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])


def _measure(variant, model_name, args, device, rank) -> dict:
    from ember import config
    from ember.bench.harness import _loss
    from ember.testing import CompileCounter
    torch.manual_seed(0)
    model, inputs = MODELS[model_name](args.smoke, device)
    model = model.to(device).train()
    if device.type == "cuda":
        model = _Autocast(model, "cuda")
    counter = CompileCounter("ember")
    cut = variant != "ember-uncut"
    with config.patch(split_ddp_graphs=cut):
        run, ddp = _wrap(variant, model, args.bucket_cap_mb, device, counter)
        clock = _Clock(device.type == "cuda")
        buckets = _Buckets(clock)
        ddp.register_comm_hook(None, buckets.hook)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        marks: dict[str, object] = {}

        def step(no_sync: bool):
            with ddp.no_sync() if no_sync else contextlib.nullcontext():
                loss = _loss(run(*inputs))
                buckets.launches.clear()
                buckets.sizes.clear()
                marks["backward"] = clock.now()
                loss.backward()
                marks["end"] = clock.now()
            opt.step()
            opt.zero_grad(set_to_none=True)

        def timed(no_sync: bool) -> float:
            times = []
            for _ in range(args.steps):
                sync()
                dist.barrier()
                start = time.perf_counter()
                step(no_sync)
                sync()
                times.append(time.perf_counter() - start)
            return statistics.median(times)

        for _ in range(args.warmup):
            step(False)
        step_s = timed(False)
        first = float("nan")
        if buckets.launches:    # (timed() synchronised after the step)
            first = clock.ms(marks["backward"], buckets.launches[0]) / clock.ms(
                marks["backward"], marks["end"])
        sizes = list(buckets.sizes)
        compute_s = timed(True)
    comm_s = _replay(sizes, device, args.steps, sync)
    hidden = 1.0 - (step_s - compute_s) / comm_s if comm_s > 0 else float("nan")
    return {"step": step_s, "compute": compute_s, "comm": comm_s,
            "hidden": min(1.0, max(0.0, hidden)), "first": first, "buckets": len(sizes),
            "graphs": counter.frame_count if variant.startswith("ember") else None}


def _replay(sizes: list[int], device, steps: int, sync) -> float:
    """Median time of all-reducing buffers of ``sizes`` elements one after another."""
    buffers = [torch.ones(n, device=device) for n in sizes]
    times = []
    for _ in range(steps):
        sync()
        dist.barrier()
        start = time.perf_counter()
        for b in buffers:
            dist.all_reduce(b)
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _worker(rank: int, world: int, port: int | None, args) -> None:
    if port is not None:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    cuda = torch.cuda.is_available() and not args.smoke
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("nccl" if cuda else "gloo",
                            timeout=datetime.timedelta(minutes=30))
    try:
        for model_name in args.models.split(","):
            for variant in args.variants.split(","):
                result = _measure(variant, model_name, args, device, rank)
                if rank == 0:
                    _print(model_name, variant, result)
    finally:
        dist.destroy_process_group()


def _print(model_name: str, variant: str, r: dict) -> None:
    graphs = "" if r["graphs"] is None else f"  graphs {r['graphs']}"
    print(f"{model_name:9} {variant:14} step {1e3 * r['step']:8.2f} ms  compute "
          f"{1e3 * r['compute']:8.2f} ms  comm {1e3 * r['comm']:7.2f} ms  hidden "
          f"{100 * r['hidden']:5.1f}%  buckets {r['buckets']:3}  first at "
          f"{100 * r['first']:5.1f}% of backward{graphs}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="small models, gloo on the CPU, 1 MiB buckets")
    parser.add_argument("--nprocs", type=int, default=None,
                        help="processes to spawn (default: the GPUs, or 2 with --smoke)")
    parser.add_argument("--models", default="gpt2,resnet50")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=None, help="timed steps (median)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--bucket-cap-mb", type=float, default=None,
                        help="DDP's bucket_cap_mb (default: DDP's 25, or 1 with --smoke; "
                             "torch.compile refuses less than 1)")
    args = parser.parse_args()
    for name in args.models.split(","):
        if name not in MODELS:
            parser.error(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    for name in args.variants.split(","):
        if name not in VARIANTS:
            parser.error(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")
    if args.steps is None:
        args.steps = 3 if args.smoke else 20
    if args.bucket_cap_mb is None and args.smoke:
        args.bucket_cap_mb = 1
    if "LOCAL_RANK" in os.environ:      # started by torchrun
        _worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, args)
        return
    world = args.nprocs or (2 if args.smoke or not torch.cuda.is_available()
                            else torch.cuda.device_count())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(world, port, args), nprocs=world, join=True)


if __name__ == "__main__":
    main()
