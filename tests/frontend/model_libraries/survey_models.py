"""Frontend survey over real models: how many capture, how many without a graph break, and
which breaks remain (run it:
``python tests/frontend/model_libraries/survey_models.py [--train] [names]``).

timm, HuggingFace transformers and torchvision models built from small configs with random
weights (nothing is downloaded), on the CPU, compiled with the counting backend
(``ember.testing.CompileCounter``): the graphs run as captured, so this measures the frontend
alone. Each model is compared with eager (outputs, and with ``--train`` a training step's
loss and parameter gradients). Not collected by pytest: it takes minutes.
"""
from __future__ import annotations

import argparse
import collections
import copy
import sys
import time
import traceback

import torch

import ember
from ember.bench import compat
from ember.frontend import graph_break
from ember.testing import CompileCounter, same


def _image(size=64, batch=2):
    return lambda: (torch.randn(batch, 3, size, size),)


def _ids(vocab=100, length=16, batch=2):
    return lambda: (torch.randint(0, vocab, (batch, length)),)


def timm_models():
    timm = compat.import_timm()
    if timm is None:
        return {}
    spec = {
        "resnet18": {}, "resnet50d": {}, "efficientnet_b0": {}, "mobilenetv3_small_100": {},
        "convnext_atto": {}, "regnety_002": {}, "ghostnet_100": {}, "densenet121": {},
        "dla34": {}, "rexnet_100": {}, "mixnet_s": {},
        "vit_tiny_patch16_224": {"img_size": 64}, "deit_tiny_patch16_224": {"img_size": 64},
        "mixer_s16_224": {"img_size": 64}, "poolformer_s12": {}, "edgenext_xx_small": {},
        "cait_xxs24_224": {"img_size": 64}, "mobilevit_xxs": {},
        "swin_tiny_patch4_window7_224": {"img_size": 224, "depths": (1, 1, 1, 1)},
        "levit_128s": {"img_size": 224},
    }
    out = {}
    for name, kwargs in spec.items():
        size = kwargs.get("img_size", 64)
        out[f"timm/{name}"] = (
            lambda name=name, kwargs=kwargs: timm.create_model(name, pretrained=False,
                                                               num_classes=10, **kwargs),
            _image(size))
    return out


def hf_models():
    t = compat.import_transformers()
    if t is None:
        return {}
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, vocab_size=100, max_position_embeddings=64)
    text = _ids()

    def cfg(name, **fields):
        return getattr(t, name)(**fields)

    out = {
        "hf/bert": (lambda: t.BertModel(cfg("BertConfig", **small)), text),
        "hf/roberta": (lambda: t.RobertaModel(cfg("RobertaConfig", **small,
                                                  pad_token_id=1)), text),
        "hf/distilbert": (lambda: t.DistilBertModel(cfg(
            "DistilBertConfig", dim=32, n_layers=2, n_heads=2, hidden_dim=64,
            vocab_size=100, max_position_embeddings=64)), text),
        "hf/albert": (lambda: t.AlbertModel(cfg("AlbertConfig", **small,
                                                embedding_size=16)), text),
        "hf/electra": (lambda: t.ElectraModel(cfg("ElectraConfig", **small,
                                                  embedding_size=16)), text),
        "hf/gpt2": (lambda: t.GPT2Model(cfg("GPT2Config", n_embd=32, n_layer=2, n_head=2,
                                            vocab_size=100, n_positions=64)), text),
        "hf/opt": (lambda: t.OPTModel(cfg("OPTConfig", hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=2, ffn_dim=64, vocab_size=100,
                                          max_position_embeddings=64,
                                          word_embed_proj_dim=32)), text),
        "hf/llama": (lambda: t.LlamaModel(cfg("LlamaConfig", **small,
                                              num_key_value_heads=1)), text),
        "hf/mistral": (lambda: t.MistralModel(cfg("MistralConfig", **small,
                                                  num_key_value_heads=1)), text),
        "hf/qwen2": (lambda: t.Qwen2Model(cfg("Qwen2Config", **small,
                                              num_key_value_heads=1)), text),
        "hf/gpt_neo": (lambda: t.GPTNeoModel(cfg(
            "GPTNeoConfig", hidden_size=32, num_layers=2, num_heads=2, vocab_size=100,
            max_position_embeddings=64, attention_types=[[["global", "local"], 1]])), text),
        "hf/t5_encoder": (lambda: t.T5EncoderModel(cfg(
            "T5Config", d_model=32, num_layers=2, num_heads=2, d_ff=64, d_kv=16,
            vocab_size=100)), text),
        "hf/vit": (lambda: t.ViTModel(cfg("ViTConfig", hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=2, intermediate_size=64,
                                          image_size=32, patch_size=8)), _image(32)),
        "hf/convnext": (lambda: t.ConvNextModel(cfg(
            "ConvNextConfig", hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])), _image(64)),
        "hf/mobilebert": (lambda: t.MobileBertModel(cfg(
            "MobileBertConfig", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, vocab_size=100, embedding_size=16, intra_bottleneck_size=16,
            true_hidden_size=16)), text),
        "hf/bart": (lambda: t.BartModel(cfg(
            "BartConfig", d_model=32, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
            decoder_ffn_dim=64, vocab_size=100, max_position_embeddings=64)), text),
        # audio: its encoder asks transformers' lru_cached availability checks per layer
        "hf/wav2vec2": (lambda: t.Wav2Vec2ForCTC(cfg(
            "Wav2Vec2Config", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, vocab_size=32, conv_dim=(16, 16), conv_stride=(5, 2),
            conv_kernel=(10, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=2)), lambda: (torch.randn(2, 1600),)),
    }
    return out


def torchvision_models():
    tv = compat.import_torchvision()
    if tv is None:
        return {}
    names = {"resnet18": 64, "alexnet": 64, "squeezenet1_1": 64, "mobilenet_v2": 64,
             "mobilenet_v3_small": 64, "shufflenet_v2_x0_5": 64, "mnasnet0_5": 64,
             "densenet121": 64, "googlenet": 64, "efficientnet_b0": 64, "regnet_y_400mf": 64,
             "convnext_tiny": 64, "resnext50_32x4d": 64, "swin_t": 64}
    out = {}
    for name, size in names.items():
        kwargs = {"aux_logits": False, "init_weights": False} if name == "googlenet" else {}
        out[f"torchvision/{name}"] = (
            lambda name=name, kwargs=kwargs: getattr(tv.models, name)(
                weights=None, num_classes=10, **kwargs), _image(size))
    return out


def _tensor_out(out):
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if isinstance(out, dict):
        return next(iter(out.values()))
    return out


def _loss(out):
    out = _tensor_out(out)
    return out.float().pow(2).mean()


def _seed(seed: int) -> None:
    """torch's and numpy's generators (wav2vec2 draws its training masks with numpy)."""
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


def run_one(build, make_inputs, train: bool):
    torch.manual_seed(0)
    model = build()
    inputs = make_inputs()
    model.train(train)
    eager_model = copy.deepcopy(model)
    cnt = CompileCounter()
    reasons: list[graph_break.BreakReason] = []
    compiled = ember.compile(model, backend=cnt)
    with graph_break.observe(lambda kind, p: reasons.append(p) if kind == "break" else None):
        if train:
            _seed(1)
            loss_e = _loss(eager_model(*inputs))
            loss_e.backward()
            _seed(1)
            loss_c = _loss(compiled(*inputs))
            loss_c.backward()
            ok = same(loss_e, loss_c, rtol=1e-3, atol=1e-4)
            for (name, pe), pc in zip(eager_model.named_parameters(), model.parameters()):
                if (pe.grad is None) != (pc.grad is None) or (
                        pe.grad is not None and not same(pe.grad, pc.grad, rtol=1e-3,
                                                         atol=1e-4)):
                    ok = False
                    break
        else:
            with torch.no_grad():
                expected = _tensor_out(eager_model(*inputs))
                actual = _tensor_out(compiled(*inputs))
                ok = same(expected, actual, rtol=1e-3, atol=1e-4)
                actual = _tensor_out(compiled(*inputs))   # the cached entries agree too
                ok = ok and same(expected, actual, rtol=1e-3, atol=1e-4)
    return ok, cnt.frame_count, reasons


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("names", nargs="*")
    parser.add_argument("--train", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    models = {**timm_models(), **hf_models(), **torchvision_models()}
    if args.names:
        models = {k: v for k, v in models.items() if any(n in k for n in args.names)}
    per_lib = collections.defaultdict(lambda: [0, 0, 0])   # total, works, zero breaks
    all_reasons = collections.Counter()
    for name, (build, make_inputs) in models.items():
        ember.reset()
        lib = name.split("/")[0]
        per_lib[lib][0] += 1
        start = time.perf_counter()
        try:
            ok, graphs, reasons = run_one(build, make_inputs, args.train)
        except Exception as e:   # noqa: BLE001 - a survey reports every failure
            print(f"{name:45s} ERROR {type(e).__name__}: {str(e)[:200]}")
            traceback.print_exc(limit=-4, file=sys.stdout)
            continue
        per_lib[lib][1] += ok
        per_lib[lib][2] += ok and not reasons
        for r in reasons:
            all_reasons[(r.reason[:150], r.location.rsplit("/", 2)[-1])] += 1
        first = f" | {reasons[0].reason[:90]} @ {reasons[0].location.rsplit('/', 2)[-1]}" \
            if reasons else ""
        print(f"{name:45s} {'ok ' if ok else 'BAD'} graphs={graphs:3d} breaks={len(reasons):3d}"
              f" {time.perf_counter() - start:5.1f}s{first}", flush=True)
    print("\nper library (models, match eager, zero breaks):")
    for lib, (total, works, clean) in per_lib.items():
        print(f"  {lib:12s} {total:3d} {works:3d} {clean:3d}")
    print("\nremaining break reasons:")
    for (reason, where), n in all_reasons.most_common():
        print(f"  {n:3d}x {reason} @ {where}")


if __name__ == "__main__":
    main()
