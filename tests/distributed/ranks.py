"""Runs scenarios on WORLD gloo processes on 127.0.0.1 for the distributed tests.

The processes are spawned once per test module; each runs every scenario in the same order
(collectives must match across ranks) and writes its results to a file the tests read.
"""
from __future__ import annotations

import datetime
import os
import socket
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2

requires_gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                   reason="torch.distributed with gloo is not available")


def _worker(rank, port, out_dir, compare, names):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    from ember import config
    results = {}
    with config.patch(fallback_on_lowering_error=False, suppress_errors=False):
        for name in names:
            try:
                results[name] = compare(name, rank)
            except Exception:
                results[name] = traceback.format_exc()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    # A rank aborted at exit once in a few runs ("terminate called without an active
    # exception") while the scenarios' DDPs, and their gloo groups, could still be alive:
    # drop what can be dropped (Ember's entries, cycles), then tear the group down together
    import gc

    import ember
    ember.reset()
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


class EagerWrapper(torch.nn.Module):
    """A wrapper whose forward capture cannot take as a whole (a break while an autocast
    entered by hand is open): it runs eagerly and must still compile the DDP it calls."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        ctx = torch.autocast("cpu", dtype=torch.bfloat16, enabled=False)
        ctx.__enter__()
        _opaque()
        ctx.__exit__(None, None, None)
        return self.module(x)


def _opaque():
    pass


def wrap(model, form: str, ddp_kwargs: dict, backend=None):
    """(what a step calls, the DDP) for ``form``: "eager" (plain DDP), "ddp_of_compiled"
    (``DDP(ember.compile(model))``), "compiled_ddp" (``ember.compile(DDP(model))``) or
    "compiled_wrapper" (``ember.compile(EagerWrapper(DDP(model)))``)."""
    import ember
    from torch.nn.parallel import DistributedDataParallel as DDP
    if form == "eager":
        ddp = DDP(model, **ddp_kwargs)
        return ddp, ddp
    if form == "ddp_of_compiled":
        ddp = DDP(ember.compile(model, backend=backend), **ddp_kwargs)
        return ddp, ddp
    ddp = DDP(model, **ddp_kwargs)
    if form == "compiled_wrapper":
        ember.disable(_opaque)
        return ember.compile(EagerWrapper(ddp), backend=backend), ddp
    return ember.compile(ddp, backend=backend), ddp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_on_ranks(compare, names, out_dir: str) -> list[dict]:
    """``compare(name, rank)`` for every name on every rank: one dict of results per rank
    (a scenario that raised maps to its traceback)."""
    mp.spawn(_worker, args=(_free_port(), out_dir, compare, list(names)), nprocs=WORLD,
             join=True)
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(WORLD)]
