"""Small HuggingFace models at several sequence lengths: automatic dynamic makes it two
compiles in all (one static, one with the sequence length symbolic), results as eager's."""
import pytest
import torch

import ember
from ember.bench import compat
from ember.testing import CompileCounter, same

transformers = compat.import_transformers()


def _models():
    if transformers is None:
        return []
    t = transformers
    return [
        ("bert", lambda: t.BertModel(t.BertConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            vocab_size=500)), "last_hidden_state"),
        ("gpt2", lambda: t.GPT2LMHeadModel(t.GPT2Config(
            n_embd=32, n_layer=1, n_head=2, vocab_size=500, bos_token_id=0, eos_token_id=0)),
         "logits"),
    ]


@pytest.mark.skipif(transformers is None, reason="transformers is not installed")
@pytest.mark.parametrize("name,make,field", _models(), ids=[m[0] for m in _models()])
def test_sequence_lengths_cost_two_compiles(name, make, field):
    torch.manual_seed(0)
    model = make().eval()
    counter = CompileCounter()
    compiled = ember.compile(model, backend=counter)
    for length in (7, 33, 64, 12):
        ids = torch.randint(0, 500, (2, length))
        with torch.no_grad():
            expected, actual = model(ids), compiled(ids)
        assert same(getattr(expected, field), getattr(actual, field), rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 2, compiled._compiled_forward._eager_reason
