"""The ``torchvision`` suite: torchvision's classification and segmentation models, random
weights (``weights=None``).

Classic CNNs (AlexNet, VGG-16 with batch norm, GoogLeNet, SqueezeNet, DenseNet, ResNet-152,
ResNeXt), mobile CNNs (MobileNet v2
and v3, ShuffleNet v2 with its channel shuffle, MnasNet, RegNet), ConvNeXt, transformers (ViT,
Swin) and a segmentation network (DeepLabV3 on MobileNetV3, atrous convolutions and
upsampling, a dict output). 224x224 images; batch 1 on the CPU, 32 on CUDA. Stochastic
depth is off (each ``StochasticDepth``'s ``p`` set to 0) so a training step is deterministic;
GoogLeNet has no auxiliary heads. ``import torchvision`` goes through
``compat.import_torchvision``, which defines the ``nms`` operator schemas its import needs
(and imports the library itself, not this module of the same name).
"""
from __future__ import annotations

import torch

from ember.bench import compat
from ember.bench.zoo.catalog import register_model

# registry name -> (torchvision builder, constructor keywords, what it covers)
TORCHVISION_MODELS = {
    "alexnet": ("alexnet", {}, "classic CNN, large fully connected layers"),
    "vgg16_bn": ("vgg16_bn", {}, "VGG-16: 13 plain 3x3 conv-bn-relu, large fully connected"),
    "googlenet": ("googlenet", {"aux_logits": False, "init_weights": True},
                  "inception blocks (parallel branches, concat)"),
    "squeezenet1_1": ("squeezenet1_1", {}, "fire modules"),
    "densenet121": ("densenet121", {}, "dense blocks (many concats)"),
    "resnet152": ("resnet152", {}, "deep ResNet: 50 bottleneck blocks"),
    "resnext50_32x4d": ("resnext50_32x4d", {}, "grouped bottleneck convolutions"),
    "mobilenet_v2": ("mobilenet_v2", {}, "inverted residuals, ReLU6"),
    "mobilenet_v3_small": ("mobilenet_v3_small", {}, "squeeze-excite, hardswish"),
    "shufflenet_v2_x1_0": ("shufflenet_v2_x1_0", {}, "channel split and shuffle"),
    "mnasnet0_5": ("mnasnet0_5", {}, "NAS-found mobile CNN"),
    "regnet_y_400mf": ("regnet_y_400mf", {}, "RegNet-Y: grouped convs, squeeze-excite"),
    "convnext_tiny": ("convnext_tiny", {}, "ConvNeXt: depthwise 7x7, layer norm"),
    "vit_b_16": ("vit_b_16", {}, "ViT-Base/16 vision transformer"),
    "swin_t": ("swin_t", {}, "Swin-T, shifted windows"),
    "deeplabv3_mobilenet_v3_large": ("segmentation.deeplabv3_mobilenet_v3_large",
                                     {"weights_backbone": None},
                                     "semantic segmentation, atrous convolutions"),
}


def _register(name: str, builder: str, kwargs: dict, what: str) -> None:
    @register_model(name, requires="torchvision", suite="torchvision", batch_size=1,
                    cuda_batch_size=32,
                    description=f"torchvision {builder} ({what}); batch 1 (CPU) or 32 (CUDA) "
                                f"x 3x224x224")
    def build(device, batch_size):
        make = compat.import_torchvision().models
        for part in builder.split("."):
            make = getattr(make, part)
        model = make(weights=None, **kwargs)
        for module in model.modules():
            if type(module).__name__ == "StochasticDepth":
                module.p = 0.0
        return model, (torch.randn(batch_size, 3, 224, 224, device=device),)


for _name, (_builder, _kwargs, _what) in TORCHVISION_MODELS.items():
    _register(_name, _builder, _kwargs, _what)
