"""The compiler backend (TorchInductor's role): ATen graph -> loop IR -> fused kernels.

``compile.py`` is the entry point and ``pipeline.py`` the stages of compiling one graph, in
order; ``dynamic.py`` and ``symbolic.py`` compile graphs with symbolic sizes (once for every
size, or once per size where the symbolic path declines). The core: ``ir.py`` (loop IR), ``ops.py`` (the ops table bodies call),
``lowering/`` (ATen ops to IR), ``graph.py`` (a graph's lowering), ``scheduler.py``
(fusion), ``loops.py``, ``sizevars.py``, ``codegen/`` (what every target's code generator
shares, and the Python wrapper). ``passes/``: graph passes; ``runtime/``: what a compiled
graph uses when it runs (the wrapper's helpers, graph and disk caches, CUDA graphs);
``targets/``: the code generation targets (``cpp/``, ``triton/``) and the policy questions
each answers for its device.
"""
