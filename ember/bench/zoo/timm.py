"""The ``timm`` suite, and the gpu suite's timm models: image models from timm, built by name
with random weights.

CNNs of several block types (residual, inverted residual with squeeze-excite, ghost modules,
ConvNeXt, RegNet, EdgeNeXt), vision transformers (ViT, DeiT with its distillation token, Swin
with shifted windows, LeViT), an MLP-Mixer and hybrids (MobileViT; MaxViT: MBConv blocks with
block and grid window attention). Each takes 224x224 images but resnet18 (128x128); batch 1 on
the CPU, 32 on CUDA. Stochastic depth and dropout stay at
timm's defaults for these models: off. The gpu suite's resnet50, mobilenetv3_large_100 and
vit_base run in bfloat16 at the batches of the training benchmark.

timm is imported through ``compat.import_timm`` (an absolute import of the library: this
module's own name does not shadow it).
"""
from __future__ import annotations

import torch

from ember.bench import compat
from ember.bench.zoo.catalog import Factory, register_model


def timm_factory(timm_name: str, image_size: int = 224) -> Factory:
    """build(device, batch_size) of timm's ``timm_name`` (random weights) on square images."""
    def build(device, batch_size):
        timm = compat.import_timm()
        return (timm.create_model(timm_name, pretrained=False),
                (torch.randn(batch_size, 3, image_size, image_size, device=device),))
    return build


# resnet18 is fully convolutional: 128x128 inputs cost a third of 224x224 and exercise the same
# graph. ViT's patch embedding fixes its input at 224x224.
register_model("resnet18", requires="timm", suite="timm", cuda_batch_size=32,
               description="timm resnet18; batch 1 (CPU) or 32 (CUDA) x 3x128x128")(
    timm_factory("resnet18", 128))
register_model("vit_tiny", requires="timm", suite="timm", cuda_batch_size=32,
               description="timm vit_tiny_patch16_224; batch 1 (CPU) or 32 (CUDA) x 3x224x224")(
    timm_factory("vit_tiny_patch16_224"))


# registry name -> (timm name, what it covers)
TIMM_MODELS = {
    "efficientnet_b0": ("efficientnet_b0", "CNN: inverted residuals, squeeze-excite, SiLU"),
    "convnext_atto": ("convnext_atto", "CNN: depthwise 7x7, layer norm, GELU"),
    "regnety_002": ("regnety_002", "CNN: grouped convolutions, squeeze-excite"),
    "ghostnet_100": ("ghostnet_100", "CNN: ghost modules (cheap convolutions, concat)"),
    "edgenext_xx_small": ("edgenext_xx_small", "hybrid CNN with transposed attention"),
    "deit_tiny": ("deit_tiny_patch16_224", "vision transformer"),
    "swin_tiny": ("swin_tiny_patch4_window7_224", "vision transformer, shifted windows"),
    "levit_128s": ("levit_128s", "hybrid: convolutional stem, attention with biases"),
    "mixer_s16": ("mixer_s16_224", "MLP-Mixer: token and channel MLPs"),
    "mobilevit_xxs": ("mobilevit_xxs", "hybrid: MobileNet blocks and transformers"),
    "maxvit_tiny_rw_224": ("maxvit_tiny_rw_224", "hybrid: MBConv blocks, block and grid "
                                                 "window attention"),
}


for _name, (_timm_name, _what) in TIMM_MODELS.items():
    register_model(_name, requires="timm", suite="timm", batch_size=1, cuda_batch_size=32,
                   description=f"timm {_timm_name} ({_what}); batch 1 (CPU) or 32 (CUDA) x "
                               f"3x224x224")(timm_factory(_timm_name))


# ------------------------------------------------- the gpu suite: large models, bfloat16, CUDA

def _timm_gpu_model(name: str, timm_name: str, cuda_batch_size: int,
                    modes: tuple[str, ...] = ("infer", "train")) -> None:
    only = "" if "train" in modes else "; inference only"
    register_model(name, requires="timm", suite="gpu", batch_size=1,
                   cuda_batch_size=cuda_batch_size, dtype=torch.bfloat16, modes=modes,
                   description=f"timm {timm_name}; batch {cuda_batch_size} (CUDA) or 1 (CPU) "
                               f"x 3x224x224, bfloat16{only}")(timm_factory(timm_name))


# The training benchmark (issue 10, AMP training on the H200) is resnet50 at batch 64,
# vit_base at 32, BERT-base at 16 x 512 and GPT-2 at 8 x 512: ``--mode train --suite gpu``
# selects those four at those sizes; mobilenetv3_large_100 is in the inference suite only.
_timm_gpu_model("resnet50", "resnet50", 64)
_timm_gpu_model("mobilenetv3_large_100", "mobilenetv3_large_100", 64, modes=("infer",))
_timm_gpu_model("vit_base", "vit_base_patch16_224", 32)
