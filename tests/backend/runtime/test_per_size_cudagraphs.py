"""The per-size CUDA graph cache over a symbolic program (``runtime/cudagraphs.py``): keyed on
the call's sizes, the most recent kept. CPU tensors decline capture and run the program,
which is enough to check the bookkeeping; the captures themselves are GPU tests
(``test_symbolic_triton.py``)."""
import torch

from ember.backend.runtime.cudagraphs import PerSizeCudaGraphs


def test_graphs_keyed_on_sizes_most_recent_kept():
    calls = []

    def program(s0, x):
        calls.append(s0)
        return (x * 2,)
    graphs = PerSizeCudaGraphs(program, [False, False], limit=2)
    for n in (3, 5, 3, 7, 5):
        x = torch.randn(n)
        (out,) = graphs(n, x)
        assert torch.equal(out, x * 2)
    assert list(graphs.runners) == [(7,), (5,)]    # 5 dropped for 7, then 3 for 5 again
    assert calls == [3, 5, 3, 7, 5]
