"""The ``hf`` suite: HuggingFace transformers models built from the configs of published
checkpoints, with random weights (nothing is downloaded).

Encoders (BERT, DistilBERT, ALBERT, ELECTRA), decoders (GPT-2, OPT, a Llama of SmolLM's
size), encoder-decoders (T5, BART) and speech (Whisper, an encoder-decoder on log-mel
features; wav2vec 2.0, an encoder on raw audio), each with its usual task head. Text inputs
are 1 x 128 token ids on the CPU and 16 x 512 on CUDA (decoder inputs of encoder-decoders a
quarter of that); decoders run with ``use_cache=False``, so outputs hold only tensors. Every
dropout, layer drop and SpecAugment probability is 0 (``models.no_dropout``): eval mode ignores
them, and a training step stays deterministic.
"""
from __future__ import annotations

from typing import Callable

import torch

from ember.bench import compat
from ember.bench.models import no_dropout, register_model


TEXT_SHAPE = "batch 1 x 128 token ids (CPU), 16 x 512 (CUDA)"


def _seq_len(device: torch.device) -> int:
    return 512 if device.type == "cuda" else 128


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
