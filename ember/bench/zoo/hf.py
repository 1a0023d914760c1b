"""The ``hf`` suite, and the gpu suite's BERT-base and GPT-2: HuggingFace transformers models
built from the configs of published checkpoints, with random weights (nothing is downloaded).

Encoders (BERT, DistilBERT, ALBERT, ELECTRA, DeBERTa-v3 with its disentangled attention),
decoders (GPT-2, OPT, a Llama of SmolLM's size, an 8-layer Mistral with grouped-query
attention), encoder-decoders (T5, BART) and speech (Whisper, an encoder-decoder on log-mel
features; wav2vec 2.0, an encoder on raw audio), each with its usual task head. Text inputs
are 1 x 128 token ids on the CPU and 16 x 512 on CUDA (8 x 512 for DeBERTa and Mistral, the
size issue 34 measured them at; decoder inputs of encoder-decoders a quarter of that); decoders run with ``use_cache=False``, so outputs hold only tensors. Every
dropout, layer drop and SpecAugment probability is 0 (``no_dropout``): eval mode ignores
them, and a training step stays deterministic.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ember.bench import compat
from ember.bench.zoo.catalog import register_model


TEXT_SHAPE = "batch 1 x 128 token ids (CPU), 16 x 512 (CUDA)"
TEXT_SHAPE_8 = "batch 1 x 128 token ids (CPU), 8 x 512 (CUDA)"


def _seq_len(device: torch.device) -> int:
    """Tokens per sequence of the language models: 512 on CUDA, 128 on the CPU."""
    return 512 if device.type == "cuda" else 128


def no_dropout(config: Any) -> Any:
    """A HF config with every ``*dropout*``, ``*layerdrop*`` and ``*_pdrop`` probability set to
    0 (GPT-2 names its dropouts ``attn_pdrop``, ``resid_pdrop``, ``embd_pdrop``; eval mode
    ignores them; a training step is then deterministic)."""
    for key, value in list(vars(config).items()):
        if ("dropout" in key or "layerdrop" in key or key.endswith("pdrop")) and \
                isinstance(value, float):
            setattr(config, key, 0.0)
    return config


def _ids(vocab: int, batch: int, length: int, device) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), device=device)


def _register(name: str, what: str, make: Callable, inputs: Callable, *,
              cuda_batch_size: int = 16, shape: str = "") -> None:
    """``make(transformers)``: the model; ``inputs(config, batch, device)``: its inputs."""
    @register_model(name, requires="transformers", suite="hf", batch_size=1,
                    cuda_batch_size=cuda_batch_size,
                    description=f"HF {name} ({what}); {shape or TEXT_SHAPE}")
    def build(device, batch_size):
        transformers = compat.import_transformers()
        model = make(transformers)
        return model, inputs(model.config, batch_size, torch.device(device))


def _text(config, batch, device):
    return (_ids(config.vocab_size, batch, _seq_len(device), device),)


def _seq2seq(config, batch, device):
    length = _seq_len(device)
    return {"input_ids": _ids(config.vocab_size, batch, length, device),
            "decoder_input_ids": _ids(config.vocab_size, batch, length // 4, device)}


def _config(transformers, cls: str, **fields):
    return no_dropout(getattr(transformers, cls)(**fields))


@register_model("bert", requires="transformers", suite="hf", batch_size=4, cuda_batch_size=32,
                description="HF BertModel, 2 layers, hidden 128; batch 4 (CPU) or 32 (CUDA) x "
                            "seq 64 token ids")
def _bert(device, batch_size):
    transformers = compat.import_transformers()
    config = transformers.BertConfig(hidden_size=128, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=256,
                                     vocab_size=1000)
    model = transformers.BertModel(config)
    return model, (torch.randint(0, config.vocab_size, (batch_size, 64), device=device),)


_register("BertForMaskedLM", "bert-base encoder, MLM head",
          lambda t: t.BertForMaskedLM(_config(t, "BertConfig")), _text)
_register("DistilBertForMaskedLM", "distilbert-base encoder, 6 layers",
          lambda t: t.DistilBertForMaskedLM(_config(t, "DistilBertConfig")), _text)
_register("AlbertForMaskedLM", "albert-base-v2: one layer shared 12 times, factorized embedding",
          lambda t: t.AlbertForMaskedLM(_config(
              t, "AlbertConfig", hidden_size=768, num_attention_heads=12,
              intermediate_size=3072, embedding_size=128)), _text)
_register("ElectraForSequenceClassification", "electra-small discriminator, hidden 256",
          lambda t: t.ElectraForSequenceClassification(_config(t, "ElectraConfig")), _text)
_register("GPT2LMHeadModel", "gpt2 decoder, 12 layers",
          lambda t: t.GPT2LMHeadModel(_config(t, "GPT2Config", use_cache=False)), _text)
_register("OPTForCausalLM", "opt-125m decoder, 12 layers",
          lambda t: t.OPTForCausalLM(_config(t, "OPTConfig", use_cache=False)), _text)
_register("LlamaForCausalLM", "Llama decoder of SmolLM-135M's size: 30 layers, hidden 576, "
                              "grouped-query attention, RoPE",
          lambda t: t.LlamaForCausalLM(_config(
              t, "LlamaConfig", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
              num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
              max_position_embeddings=2048, tie_word_embeddings=True, use_cache=False)), _text)
_register("T5ForConditionalGeneration", "t5-small encoder-decoder",
          lambda t: t.T5ForConditionalGeneration(_config(t, "T5Config", use_cache=False)),
          _seq2seq, shape="batch 1 x 128 + 32 token ids (CPU), 16 x 512 + 128 (CUDA)")
_register("BartForConditionalGeneration", "bart-base encoder-decoder, 6 + 6 layers",
          lambda t: t.BartForConditionalGeneration(_config(
              t, "BartConfig", d_model=768, encoder_layers=6, decoder_layers=6,
              encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
              decoder_ffn_dim=3072, use_cache=False)),
          _seq2seq, shape="batch 1 x 128 + 32 token ids (CPU), 16 x 512 + 128 (CUDA)")


# The two HF models of issue 34's GPU table, measured at 8 x 512 tokens on the H100.
_register("DebertaV2ForMaskedLM", "deberta-v3-base's config: 12 layers, hidden 768, "
                                  "disentangled relative attention (p2c, c2p), MLM head",
          lambda t: t.DebertaV2ForMaskedLM(_config(
              t, "DebertaV2Config", hidden_size=768, num_hidden_layers=12,
              num_attention_heads=12, intermediate_size=3072, vocab_size=128100,
              relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm",
              share_att_key=True, pos_att_type=["p2c", "c2p"], max_relative_positions=-1,
              position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7)),
          _text, cuda_batch_size=8, shape=TEXT_SHAPE_8)
# 8 Mistral layers at GPT-2's width: 12 query heads share 4 key/value heads (head 64), a
# 4x SwiGLU MLP (3072), RoPE, Mistral's own 32000-token vocabulary and 4096-token sliding
# window (wider than the sequence, so the mask is plain causal).
_register("MistralForCausalLM", "Mistral decoder, 8 layers, hidden 768, grouped-query "
                                "attention 12 / 4 heads, MLP 3072, vocab 32000",
          lambda t: t.MistralForCausalLM(_config(
              t, "MistralConfig", hidden_size=768, intermediate_size=3072,
              num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4,
              head_dim=64, vocab_size=32000, max_position_embeddings=4096,
              sliding_window=4096, use_cache=False)),
          _text, cuda_batch_size=8, shape=TEXT_SHAPE_8)


def _whisper_inputs(config, batch, device):
    frames = 2 * config.max_source_positions   # the encoder's convolutions halve it
    return {"input_features": torch.randn(batch, config.num_mel_bins, frames, device=device),
            "decoder_input_ids": _ids(config.vocab_size, batch, _seq_len(device) // 4, device)}


_register("WhisperForConditionalGeneration", "whisper-tiny speech encoder-decoder",
          lambda t: t.WhisperForConditionalGeneration(_config(t, "WhisperConfig",
                                                              use_cache=False)),
          _whisper_inputs, shape="batch 1 (CPU) or 16 (CUDA) x 80 mel bins x 3000 frames + "
                                 "32 / 128 token ids")


def _audio(config, batch, device):
    return (torch.randn(batch, 16000, device=device),)


_register("Wav2Vec2ForCTC", "wav2vec2-base speech encoder on raw audio, CTC head",
          lambda t: t.Wav2Vec2ForCTC(_config(t, "Wav2Vec2Config", vocab_size=32,
                                             mask_time_prob=0.0, layerdrop=0.0)),
          _audio, shape="batch 1 (CPU) or 16 (CUDA) x 1 s of 16 kHz audio")


# ------------------------------------------------- the gpu suite: large models, bfloat16, CUDA

@register_model("bert_base", requires="transformers", suite="gpu", batch_size=1,
                cuda_batch_size=16, dtype=torch.bfloat16,
                description="HF BertModel, BERT-base config (12 layers, hidden 768); batch 16 "
                            "x 512 token ids (CUDA) or 1 x 128 (CPU), bfloat16")
def _bert_base(device, batch_size):
    transformers = compat.import_transformers()
    config = transformers.BertConfig()   # the defaults are bert-base-uncased's sizes
    model = transformers.BertModel(config)
    return model, (torch.randint(0, config.vocab_size, (batch_size, _seq_len(device)),
                                 device=device),)


@register_model("gpt2", requires="transformers", suite="gpu", batch_size=1,
                cuda_batch_size=16, cuda_train_batch_size=8, dtype=torch.bfloat16,
                description="HF GPT2Model, GPT-2 small config (12 layers, hidden 768), no LM "
                            "head; batch 16 x 512 token ids (CUDA; 8 x 512 in train mode) or "
                            "1 x 128 (CPU), bfloat16")
def _gpt2(device, batch_size):
    transformers = compat.import_transformers()
    config = transformers.GPT2Config(use_cache=False)   # defaults: the 124M-parameter gpt2
    model = transformers.GPT2Model(config)
    return model, (torch.randint(0, config.vocab_size, (batch_size, _seq_len(device)),
                                 device=device),)
