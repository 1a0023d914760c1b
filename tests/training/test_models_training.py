"""Training real architectures through ember.compile ("ember" backend) against eager (and
under the Triton target's GPU policies, on its interpreter).

timm resnet18 and vit_tiny, HF BERT and GPT-2, small configs and inputs (random weights,
nothing downloaded) so the 2-core CI stays fast: outputs, the .grad of every parameter and
the buffers after a forward and backward, then after an SGD step. Skipped when timm or
transformers is not installed.
"""
import pytest
import torch

from ember.bench import compat
from ember.bench.zoo.hf import no_dropout
from test_training import train_side_by_side


def _timm(name, **kwargs):
    timm = compat.import_timm()
    if timm is None:
        pytest.skip("needs timm")
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, **kwargs).train()


def _transformers():
    transformers = compat.import_transformers()
    if transformers is None:
        pytest.skip("needs transformers")
    torch.manual_seed(0)
    return transformers


def test_resnet18():
    model = _timm("resnet18", num_classes=10)
    train_side_by_side(model, lambda: (torch.randn(2, 3, 64, 64),), steps=2, lr=0.01,
                       atol=1e-4, rtol=1e-3)


def test_vit_tiny():
    model = _timm("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10)
    train_side_by_side(model, lambda: (torch.randn(2, 3, 32, 32),), steps=2, lr=0.01,
                       atol=1e-4, rtol=1e-3)


def test_no_dropout_zeroes_every_dropout_probability():
    transformers = _transformers()
    gpt2 = no_dropout(transformers.GPT2Config())
    assert (gpt2.attn_pdrop, gpt2.resid_pdrop, gpt2.embd_pdrop,
            gpt2.summary_first_dropout) == (0.0, 0.0, 0.0, 0.0)
    bert = no_dropout(transformers.BertConfig())
    assert (bert.hidden_dropout_prob, bert.attention_probs_dropout_prob) == (0.0, 0.0)
    assert bert.classifier_dropout is None and bert.vocab_size == 30522     # others untouched


def test_bert():
    transformers = _transformers()
    config = no_dropout(transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        vocab_size=500))
    model = transformers.BertModel(config).train()
    train_side_by_side(model, lambda: (torch.randint(0, 500, (2, 16)),), steps=2, lr=0.01,
                       atol=1e-4, rtol=1e-3)


def test_gpt2():
    transformers = _transformers()
    config = no_dropout(transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=2, vocab_size=500, n_positions=64, use_cache=False,
        eos_token_id=None, bos_token_id=None))        # no_dropout zeroes GPT-2's *_pdrop
    model = transformers.GPT2Model(config).train()
    train_side_by_side(model, lambda: (torch.randint(0, 500, (2, 16)),), steps=2, lr=0.01,
                       atol=1e-4, rtol=1e-3)


@pytest.fixture
def gpu_policies(monkeypatch):
    """The Triton target's GPU policies (recompute limit 64, merged-row views read through)
    on the interpreter, whose own policies are the CPU's: the training graphs a GPU would
    get, checked here against eager. The graph cache is off: the policies are not in its key."""
    import os
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter runs only in processes started with TRITON_INTERPRET=1")
    from ember.backend.targets.triton.target import TritonInterpreterTarget
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "0")
    monkeypatch.setattr(TritonInterpreterTarget, "recompute_limit", 64)
    monkeypatch.setattr(TritonInterpreterTarget, "inlines_merged_views", True)
    return {"cpu_backend": "triton"}


def test_vit_tiny_under_gpu_policies(gpu_policies):
    model = _timm("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10)
    train_side_by_side(model, lambda: (torch.randn(2, 3, 32, 32),), steps=2, lr=0.01,
                       atol=1e-4, rtol=1e-3, options=gpu_policies)


def test_gpt2_under_gpu_policies(gpu_policies):
    transformers = _transformers()
    config = no_dropout(transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=2, vocab_size=500, n_positions=64, use_cache=False,
        eos_token_id=None, bos_token_id=None))
    model = transformers.GPT2Model(config).train()
    train_side_by_side(model, lambda: (torch.randint(0, 500, (2, 16)),), steps=2, lr=0.01,
                       atol=1e-4, rtol=1e-3, options=gpu_policies)
