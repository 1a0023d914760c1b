"""``ember explain MODEL``: ember.explain's report for a zoo or user model, from the CLI."""
import textwrap

import pytest

from ember.bench import cli

USER_MODEL = '''
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        print("a print breaks the graph")
        return torch.relu(y) * 2

def make():
    return Net(), (torch.randn(2, 4),)
'''


def test_explain_a_user_model_reports_its_break(tmp_path, capsys):
    path = tmp_path / "net.py"
    path.write_text(textwrap.dedent(USER_MODEL))
    assert cli.main(["explain", f"{path}:make"]) == 0
    out = capsys.readouterr().out
    assert "Graph count: 2" in out and "Graph break count: 1" in out
    assert f"{path}:11" in out and 'print("a print breaks the graph")' in out


def test_explain_a_zoo_model_without_breaks(capsys):
    assert cli.main(["explain", "mlp"]) == 0
    out = capsys.readouterr().out
    assert "Graph count: 1" in out and "Graph break count: 0" in out


def test_explain_an_unknown_model_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["explain", "no_such_model"])
    assert exit_info.value.code == 2
    assert "unknown model(s): no_such_model" in capsys.readouterr().err
