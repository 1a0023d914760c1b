"""The compiler backend (TorchInductor's role): ATen graph -> loop IR -> fused kernels."""
