"""More real models captured in one graph with eager's outputs: decoder LMs with KV-cache
objects (GPT-2, Llama), an encoder-only T5, and timm CNNs built from other block types."""
import pytest
import torch

import ember
from ember.bench import compat
from ember.testing import CompileCounter, same

timm = compat.import_timm()
transformers = compat.import_transformers()


def _check_one_graph(model, *inputs):
    model = model.eval()
    cnt = CompileCounter()
    compiled = ember.compile(model, backend=cnt)
    with torch.no_grad():
        expected, actual = model(*inputs), compiled(*inputs)
    if hasattr(expected, "last_hidden_state"):
        expected, actual = expected.last_hidden_state, actual.last_hidden_state
    assert same(expected, actual, rtol=1e-4, atol=1e-5)
    assert cnt.frame_count == 1, compiled._compiled_forward._eager_reason


def _hf_models():
    if transformers is None:
        return []
    t = transformers
    return [
        ("gpt2", lambda: t.GPT2Model(t.GPT2Config(n_embd=64, n_layer=2, n_head=2,
                                                  vocab_size=1000, bos_token_id=0,
                                                  eos_token_id=0))),
        ("llama", lambda: t.LlamaModel(t.LlamaConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            intermediate_size=128, vocab_size=1000))),
        ("t5_encoder", lambda: t.T5EncoderModel(t.T5Config(
            d_model=64, num_layers=2, num_heads=2, vocab_size=1000, d_ff=128, d_kv=32))),
    ]


@pytest.mark.skipif(transformers is None, reason="transformers is not installed")
@pytest.mark.parametrize("name, make", _hf_models(), ids=[n for n, _ in _hf_models()])
def test_hf_model_one_graph(name, make):
    torch.manual_seed(0)
    _check_one_graph(make(), torch.randint(0, 1000, (2, 16)))


@pytest.mark.skipif(timm is None, reason="timm is not installed")
@pytest.mark.parametrize("name", ["efficientnet_b0", "convnext_atto", "mobilenetv3_small_100"])
def test_timm_model_one_graph(name):
    torch.manual_seed(0)
    _check_one_graph(timm.create_model(name, pretrained=False), torch.randn(1, 3, 64, 64))


def test_int_plus_equals_tensor_is_an_out_of_place_add():
    def f(xs):
        total = 0
        for x in xs:
            total += x
        return total

    cnt = CompileCounter()
    xs = [torch.randn(3) for _ in range(3)]
    assert same(ember.compile(f, backend=cnt)(xs), f(xs))
    assert cnt.frame_count == 1
