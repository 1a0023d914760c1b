import pytest
import torch


@pytest.fixture(autouse=True)
def _forget_torch_frontend_graphs():
    """Tests here compile through torch's own frontend, which keeps every compiled graph (and
    the kernel libraries it loaded) until ``torch._dynamo.reset()``: let the next test start
    without them."""
    yield
    torch._dynamo.reset()
