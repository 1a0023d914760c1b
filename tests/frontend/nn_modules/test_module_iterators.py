"""``module.parameters()`` and its kind are generators (``next(self.parameters())``), and a
lazy module's first call initialises it, as eager's does, also under ``fullgraph=True``."""
import pytest
import torch

import ember


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("shift", torch.full((3,), 0.5))


_READS = {
    "next_parameters": lambda m, x: x.to(next(m.parameters()).dtype) + next(m.parameters())[0],
    "next_iter_buffers": lambda m, x: x + next(iter(m.buffers())),
    "next_named_parameters": lambda m, x: x + next(m.named_parameters())[1].sum(),
    "next_children": lambda m, x: next(m.children())(x),
    "next_named_modules": lambda m, x: x * len(next(m.named_modules())[0] + "ab"),
    "next_with_default": lambda m, x: next(m.lin.buffers(), x) + 1,
    "parameters_not_recursive": lambda m, x: x + len(list(m.parameters(False))),
    "named_parameters_prefix": lambda m, x: x * len(next(m.named_parameters("p"))[0]),
    "list_named_buffers": lambda m, x: x + sum(b for _, b in m.named_buffers()),
    "tuple_modules": lambda m, x: x * len(tuple(m.modules())),
}


@pytest.mark.parametrize("read", sorted(_READS))
@pytest.mark.parametrize("fullgraph", [False, True])
def test_module_generators(read, fullgraph):
    class Net(Holder):
        def forward(self, x):
            return _READS[read](self, x)
    m = Net()
    x = torch.randn(2, 3)
    torch.testing.assert_close(ember.compile(m, backend="eager", fullgraph=fullgraph)(x), m(x))


class LazyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.LazyLinear(4)
        self.conv = torch.nn.LazyConv2d(2, 3, padding=1)
        self.norm = torch.nn.LazyBatchNorm1d()

    def forward(self, x):
        y = self.conv(x.reshape(-1, 2, 1, 3))
        return self.norm(self.lin(x).relu()).sum(1) + y.flatten(1).sum(1)


@pytest.mark.parametrize("backend", ["eager", "ember"])
def test_lazy_modules_initialise_on_first_call(backend):
    m, ref = LazyNet(), LazyNet()
    compiled = ember.compile(m, backend=backend, fullgraph=True)
    x = torch.randn(5, 6)
    for inp in (x, x * 2):
        torch.manual_seed(1)
        got = compiled(inp)
        torch.manual_seed(1)
        torch.testing.assert_close(got, ref(inp), rtol=1e-4, atol=1e-5)
    assert type(m.lin) is torch.nn.Linear and type(m.conv) is torch.nn.Conv2d
    for a, b in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(m.norm.running_mean, ref.norm.running_mean)


def test_lazy_module_called_from_compiled_function():
    torch.manual_seed(0)
    lazy, ref = torch.nn.LazyLinear(3), torch.nn.LazyLinear(3)
    x = torch.randn(2, 5)
    fn = ember.compile(lambda x: lazy(x).sigmoid(), backend="eager", fullgraph=True)
    torch.manual_seed(7)
    got = fn(x)
    torch.manual_seed(7)
    torch.testing.assert_close(got, ref(x).sigmoid())
    torch.testing.assert_close(fn(x), ref(x).sigmoid())


class NoisyLazy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.LazyLinear(4)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        x = self.drop(x + torch.randn(x.shape))   # draws before the lazy initialisation
        return self.lin(x).relu()


@pytest.mark.parametrize("backend", ["eager", "ember"])
def test_lazy_module_after_random_ops_draws_in_eagers_order(backend):
    # eager: the graph's randn and dropout draw, then the initialisation; initialising at
    # capture would draw first (other weights, other noise)
    x = torch.randn(2, 5)
    torch.manual_seed(3)
    ref = NoisyLazy()
    want = ref(x)
    after_ref = torch.rand(2)
    torch.manual_seed(3)
    m = NoisyLazy()
    got = ember.compile(m, backend=backend)(x)
    torch.testing.assert_close(torch.rand(2), after_ref)
    torch.testing.assert_close(got, want)
    for a, b in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b)


def test_next_parameter_reads_only_what_it_takes():
    from ember.testing import CompileCounter

    class Deep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(20)])

        def forward(self, x):
            return x.to(next(self.parameters()).dtype) * 2
    m = Deep()
    counter = CompileCounter()
    x = torch.randn(3)
    torch.testing.assert_close(ember.compile(m, backend=counter, fullgraph=True)(x), m(x))
    placeholders = [n for n in counter.graphs[0].graph.nodes if n.op == "placeholder"]
    assert len(placeholders) <= 2      # x (and the first weight), not all 40 parameters
    m.layers[0].register_parameter("weight", None)      # now the first is layers.0.bias
    torch.testing.assert_close(ember.compile(m, backend="eager")(x), m(x))


def _graph_break():
    print("", end="")


@pytest.mark.parametrize("pattern", ["loop", "next_then_loop", "loop_break_then_next"])
def test_graph_break_while_walking_the_tree(pattern):
    class Net(Holder):
        def forward(self, x):
            if pattern == "loop":
                for name, p in self.named_parameters():
                    _graph_break()
                    x = x + p.sum() * len(name)
                return x
            it = self.parameters()
            x = x + next(it).sum()
            for p in it:
                _graph_break()
                x = x * 2 + p.sum()
                if pattern == "loop_break_then_next":
                    break
            return x + next(it, torch.zeros(())).sum() + next(iter(self.buffers())).sum()
    from ember import metrics
    m = Net()
    x = torch.randn(3)
    compiled = ember.compile(m, backend="eager")
    eager_frames = metrics.counters["frontend"]["frames_eager"]
    for _ in range(2):
        torch.testing.assert_close(compiled(x), m(x))
    if pattern == "loop":    # the loop's resume functions are compiled too
        assert metrics.counters["frontend"]["frames_eager"] == eager_frames


@pytest.mark.parametrize("backend", ["eager", "ember"])
def test_a_compiled_lazy_module_initialises_itself_not_the_wrapper(backend):
    # nn.Module.__call__ on the wrapper runs the module's hooks; the lazy one used to turn the
    # wrapper into a Linear ("'Linear' object has no attribute '_forward_hooks'")
    lazy, ref = torch.nn.LazyLinear(4), torch.nn.LazyLinear(4)
    compiled = ember.compile(lazy, backend=backend)
    x = torch.randn(2, 3)
    torch.manual_seed(3)
    got = compiled(x)
    torch.manual_seed(3)
    torch.testing.assert_close(got, ref(x))
    torch.testing.assert_close(compiled(x * 2), ref(x * 2))
    assert type(lazy) is torch.nn.Linear and type(compiled) is not torch.nn.Linear
    assert compiled.weight is lazy.weight
