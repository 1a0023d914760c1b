"""Objects whose missing attributes raise something other than AttributeError (torch.classes
namespaces) are looked up in the disable registry without failing the capture."""
import torch

import ember
from ember.frontend import trace_rules


def test_torch_classes_namespace_is_not_disabled():
    namespace = torch.classes.ember_no_such_namespace
    assert trace_rules.is_disabled(namespace) is False


def test_frame_reading_a_torch_classes_namespace_compiles():
    """Wav2Vec2 reads a ``torch.classes`` namespace in its forward; the capture failed with
    "Tried to instantiate class '__func__.__code__'"."""
    namespace = torch.classes.ember_no_such_namespace

    def fn(x):
        ns = namespace
        return x * 2 if ns is not None else x

    x = torch.randn(3)
    torch.testing.assert_close(ember.compile(fn, backend="eager")(x), fn(x))
