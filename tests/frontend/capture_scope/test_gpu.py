"""Capture of CUDA programs: fake tensors report the real device, guards check it."""
import pytest
import torch

import ember
from ember.testing import CompileCounter, same

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_cuda_function_one_graph_and_same_values():
    def fn(x, y):
        z = torch.relu(x @ y) + 1
        return z.softmax(-1), z.device.type, torch.ones(2, device=x.device)

    cnt = CompileCounter()
    cf = ember.compile(fn, backend=cnt)
    x, y = torch.randn(8, 16, device="cuda"), torch.randn(16, 4, device="cuda")
    assert same(cf(x, y), fn(x, y))
    assert cnt.frame_count == 1


def test_device_change_recompiles():
    cnt = CompileCounter()
    cf = ember.compile(lambda x: x * 2 + 1, backend=cnt)
    x = torch.randn(4)
    assert same(cf(x), x * 2 + 1)
    assert same(cf(x.cuda()), x.cuda() * 2 + 1)
    assert cnt.frame_count == 2


def test_cuda_module_training_step_grads_match():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)).cuda()
    ref = torch.nn.Sequential(*[m for m in model])
    cnt = CompileCounter()
    cm = ember.compile(model, backend=cnt)
    x = torch.randn(8, 16, device="cuda")
    cm(x).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref(x).sum().backward()
    assert all(same(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert cnt.frame_count == 1
