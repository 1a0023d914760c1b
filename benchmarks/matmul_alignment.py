"""cuBLAS and an output row that is not 16-byte aligned: bf16 ``x @ w.t()`` for an LM head
(GPT-2: 8192 x 768 by 768 x 50257) with N as is, with N padded to a multiple of 8 (then the
slice copied out contiguously, as eager's layout asks), and a plain copy of the logits.

    PYTHONPATH=. python3 benchmarks/matmul_alignment.py [M K N ...]
"""
import sys

import torch

from benchmarks.profile_models import median_ms


def main() -> None:
    shapes = [int(v) for v in sys.argv[1:]] or [8192, 768, 50257, 8192, 768, 30522,
                                                 6000, 384, 51865]
    for m, k, n in zip(shapes[::3], shapes[1::3], shapes[2::3]):
        n8 = -(-n // 8) * 8
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        w8 = torch.nn.functional.pad(w, (0, 0, 0, n8 - n))
        as_is = median_ms(lambda: x @ w.t())
        padded = median_ms(lambda: x @ w8.t())
        sliced = median_ms(lambda: (x @ w8.t())[:, :n].contiguous())
        copy = median_ms(lambda out, src: out.copy_(src), torch.empty(m, n, device="cuda",
                         dtype=torch.bfloat16), torch.empty(m, n, device="cuda",
                                                            dtype=torch.bfloat16))
        tflops = 2 * m * k * n / 1e9
        print(f"{m}x{k} @ {k}x{n} bf16: as is {as_is:.3f} ms ({tflops / as_is:.0f} TFLOP/s), "
              f"N padded to {n8} {padded:.3f} ms ({tflops / padded:.0f} TFLOP/s), padded and "
              f"copied out {sliced:.3f} ms; a copy of the logits {copy:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
