"""Models and compilers for the ``ember bench`` tests, named as ``bench_fakes:NAME`` (this
folder is on ``sys.path`` under pytest, and the rows' processes inherit it)."""
import os
import time

import torch
from torch import nn


def tiny():
    """A user's model: (model, example_inputs)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)), (torch.randn(3, 8),)


def slow_model():
    """Takes longer to build than the budget test's whole --budget."""
    time.sleep(0.2)
    return tiny()


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, *, scale):
        return self.proj(x) * scale


def keywords(batch_size=2):
    """Keyword inputs, and a batch_size parameter that --batch-size reaches."""
    return Pair(), {"x": torch.randn(batch_size, 8), "scale": torch.full((batch_size, 1), 2.0)}


def crashing():
    os.abort()


def hanging():
    time.sleep(600)


def slow_compiler(model):
    """Takes half a second to 'compile': the row's first call must include it."""
    time.sleep(0.5)
    return model


def failing_compiler(model):
    raise RuntimeError("this compiler always fails")


def wrong_compiler(model):
    """Compiles 'successfully' and computes something else."""
    return lambda *args: model(*args) + 1e-2


def no_grad_compiler(model):
    """Right outputs, but no gradients reach the parameters."""
    return lambda *args: model(*args).detach().requires_grad_()


def snapshot_out():
    """Copies ``$EMBER_TEST_OUT/results.json`` (the run's file while this row is built) to
    ``$EMBER_TEST_SNAPSHOT``, then is ``tiny``."""
    import shutil
    shutil.copy(os.path.join(os.environ["EMBER_TEST_OUT"], "results.json"),
                os.environ["EMBER_TEST_SNAPSHOT"])
    return tiny()


def fails_until_fixed():
    """Cannot be built until EMBER_TEST_FIXED is set: a row that errors, then succeeds."""
    if not os.environ.get("EMBER_TEST_FIXED"):
        raise RuntimeError("not fixed yet")
    return tiny()
