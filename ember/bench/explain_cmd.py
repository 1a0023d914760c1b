"""``ember explain MODEL``: where a model's graphs break, and why.

    ember explain resnet18
    ember explain my_models:make_net --device cpu
    ember explain path/to/file.py:make_net --mode train

``MODEL`` is a zoo model name (``ember bench --list``) or a user's ``module:callable`` /
``file.py:callable`` returning ``(model, example_inputs)``, as ``ember bench --models`` takes.
The model runs once under Ember's frontend (graphs run as captured, nothing is timed) and
``ember.explain``'s report is printed: the number of graphs and breaks, each break's reason
with the user's ``file:line`` and source line, and the ops per graph.
"""
from __future__ import annotations

import argparse

import torch


def build_parser(prog: str = "ember explain") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a zoo model name, or module:callable / "
                                      "file.py:callable returning (model, example_inputs)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--mode", choices=["infer", "train"], default="infer",
                        help="infer: eval() under no_grad (default); train: forward with "
                             "grad, as a training step captures it")
    parser.add_argument("--batch-size", type=int, default=None, metavar="N")
    return parser


def explain_main(argv: list[str], prog: str = "ember explain") -> int:
    import ember
    from ember.bench import zoo
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    try:
        model, inputs = zoo.build_model(args.model, args.device, mode=args.mode,
                                        batch_size=args.batch_size)
    except (ValueError, TypeError, LookupError) as e:
        parser.error(f"{args.model}: {e}")
    grad = torch.enable_grad() if args.mode == "train" else torch.no_grad()
    with grad:
        report = ember.explain(model)(*inputs)
    print(report)
    return 0
