"""Bytecode capture (TorchDynamo's role): Python frames -> FX graphs + guards + new code."""
