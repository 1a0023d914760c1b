"""The ``timm`` suite: image models from timm, built by name with random weights.

CNNs of several block types (residual, inverted residual with squeeze-excite, ghost modules,
ConvNeXt, RegNet, EdgeNeXt), vision transformers (ViT, DeiT with its distillation token, Swin
with shifted windows, LeViT), an MLP-Mixer and a hybrid (MobileViT). Each takes 224x224 images
(resnet18 and vit_tiny are registered in ``models.py``); batch 1 on the CPU, 32 on CUDA.
Stochastic depth and dropout stay at timm's defaults for these models: off.
"""
from __future__ import annotations

from ember.bench.models import register_model, timm_factory

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
}


for _name, (_timm_name, _what) in TIMM_MODELS.items():
    register_model(_name, requires="timm", suite="timm", batch_size=1, cuda_batch_size=32,
                   description=f"timm {_timm_name} ({_what}); batch 1 (CPU) or 32 (CUDA) x "
                               f"3x224x224")(timm_factory(_timm_name))
