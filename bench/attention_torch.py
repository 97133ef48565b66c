#!/usr/bin/env python3
"""Reference numbers for bench/attention.cu: torch's scaled_dot_product_attention (bf16,
is_causal=True, batch 1) forward and backward TFLOP/s, same shapes and FLOP convention
(fwd = 4 S^2 hd H / 2, bwd = 2.5 fwd). Runs the cuDNN backend and the flash backend where
torch offers them. A benchmark helper only: easyctx never depends on torch."""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_ms(fn, warm, reps):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, nargs="+", default=[8192, 32768, 131072])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    shapes = [("32x128 MHA", 32, 32, 128), ("GQA 32/4 x64", 32, 4, 64)]
    print(f"# torch {torch.__version__} SDPA ({torch.cuda.get_device_name()}), bf16, causal, batch 1\n")
    print("| backend | shape | seq | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s |\n|---|---|---|---|---|---|---|")
    for bname, backend in [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]:
        for name, hq, hkv, hd in shapes:
            for s in args.seq:
                q = torch.randn(1, hq, s, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                k = torch.randn(1, hkv, s, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                v = torch.randn(1, hkv, s, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                do = torch.randn(1, hq, s, hd, device="cuda", dtype=torch.bfloat16)
                warm, reps = (1, max(3, args.reps // 2)) if s >= 131072 else (3, args.reps)
                gqa = hq != hkv
                try:
                    with sdpa_kernel(backend):
                        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
                        tf = time_ms(fwd, warm, reps)
                        out = fwd()
                        bwd = lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
                        tb = time_ms(bwd, warm, reps)
                except RuntimeError as e:
                    print(f"| {bname} | {name} | {s} | n/a ({str(e).splitlines()[0][:60]}) | | | |")
                    continue
                fl = 4.0 * s * s * hd * hq / 2
                print(f"| {bname} | {name} | {s} | {tf:.2f} | {fl / tf / 1e9:.0f} | {tb:.2f} | {2.5 * fl / tb / 1e9:.0f} |",
                      flush=True)
                del q, k, v, do, out
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
