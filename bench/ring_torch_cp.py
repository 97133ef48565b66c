#!/usr/bin/env python3
"""Peer for bench/ring.cu (issue 6): torch's own context parallelism (context_parallel from
torch.distributed.tensor.experimental: ring attention over SDPA), forward + backward per GPU with
W GPUs against plain SDPA on one GPU at the same tokens per GPU (weak scaling); bf16, causal,
batch 1, q/k/v [1, H, S, hd], shapes 32 x 128 (MHA) and GQA 32/4 x 64. FLOPs as bench_ring: S
tokens cost fwd = 4 S^2 hd H / 2 (causal), bwd = 2.5 fwd, H = query heads; each of W GPUs owns
1/W of the S = W x tokens_per_gpu sequence's work; efficiency = CP TFLOP/s per GPU / 1-GPU
TFLOP/s. Time: median of --reps fwd+bwd after --warmup, host clock between synchronize() calls
after a barrier, the slowest rank's median (all_reduce MAX).
Run:  torchrun --nproc_per_node 2 bench/ring_torch_cp.py [--tokens 16384 32768 65536] [--reps 3]
      python3 bench/ring_torch_cp.py --world1 [...]   (one GPU, no process group: baseline only)
Under torchrun each rank also times plain SDPA at tokens_per_gpu (as bench_ring), so efficiency
comes from one call. context_parallel shards q/k/v in place (head-tail = zigzag order while load
balancing is on) once per configuration, outside the timed region. --backend (cuDNN by default)
on both sides, else torch's default; GQA uses enable_gqa, else k/v expanded to 32 heads (noted).
"""
import argparse
import contextlib
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor.experimental import context_parallel
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = {"mha": ("32 x 128", 32, 32, 128), "gqa": ("GQA 32/4 x 64", 32, 4, 64)}
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "default": None}
ORIG_SDPA = F.scaled_dot_product_attention  # context_parallel monkey-patches this attribute of F
NPROC = 1


def cp_module():  # CP's implementation: _context_parallel/_attention.py since torch 2.9, before _attention.py
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention as m
    except ImportError:
        from torch.distributed.tensor.experimental import _attention as m
    return m


def apply_knobs(args):
    """Set the optional CP knobs (torch-private state); each reports whether it took."""
    knobs, lb = {}, not args.no_load_balance
    for name, value, apply in (("rotate", args.rotate, lambda m: m.set_rotate_method(args.rotate)),
                               ("load_balance", lb, lambda m: setattr(m._cp_options, "enable_load_balance", lb))):
        try:
            apply(cp_module())
            knobs[name] = value
        except Exception as e:
            knobs[name] = f"{value} not applied ({type(e).__name__}: {e})"
    return knobs


def cp_cleanup():
    """context_parallel has no try/finally: after an exception in its `with` F's SDPA stays patched."""
    with contextlib.suppress(Exception):  # torch's own undo (also restores F), private
        cp_module()._disable_context_parallel_dispatcher_impl()
    F.scaled_dot_product_attention = ORIG_SDPA


def reduce(x, op):  # over the ranks
    t = torch.tensor([float(x)], device="cuda", dtype=torch.float64)
    if NPROC > 1:
        dist.all_reduce(t, op=op)
    return t.item()


def seconds(step, warm, reps):
    for _ in range(warm):
        step()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        if NPROC > 1:
            dist.barrier()
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return reduce(statistics.median(ts), dist.ReduceOp.MAX)  # the slowest rank sets the pace


def run_one(cp_mesh, shape, T, backend, expand, args):
    """(median fwd+bwd seconds, backend) of plain SDPA at T tokens (cp_mesh None) or CP at W x T."""
    _, hq, hkv, hd = shape
    W = cp_mesh.size() if cp_mesh is not None else 1
    g = torch.Generator(device="cuda").manual_seed(1234)  # the same full tensors on every rank
    q, k, v = (torch.randn(1, h, W * T, hd, device="cuda", dtype=torch.bfloat16, generator=g) for h in (hq, hkv, hkv))
    if expand:
        k, v = (t.repeat_interleave(hq // hkv, dim=1) for t in (k, v))
    gqa = k.shape[1] != hq
    dout = torch.randn(1, hq, T, hd, device="cuda", dtype=torch.bfloat16, generator=g)
    sel = sdpa_kernel(BACKENDS[backend]) if BACKENDS[backend] is not None else contextlib.nullcontext()
    cp = contextlib.nullcontext() if cp_mesh is None else context_parallel(
        cp_mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2], no_restore_buffers={q, k, v})
    with sel, cp:  # from here q, k, v are this rank's [1, H, T, hd] shards
        ql, kl, vl = (t.detach().requires_grad_() for t in (q, k, v))
        label = backend
        if BACKENDS[backend] is None:  # name what torch picks for these shapes
            with contextlib.suppress(Exception):
                label += ":" + SDPBackend(torch._fused_sdp_choice(ql, kl, vl, is_causal=True, enable_gqa=gqa)).name

        def step():
            ql.grad = kl.grad = vl.grad = None
            out = F.scaled_dot_product_attention(ql, kl, vl, is_causal=True, enable_gqa=gqa)
            out.backward(dout)

        return seconds(step, args.warmup, args.reps), label


def measure(cp_mesh, shape, T, args):
    """Requested backend first, then torch's default; GQA natively first, then k/v expanded.
    The ranks agree on each attempt's outcome (a failure on one rank only can still hang)."""
    errors = []
    for backend in dict.fromkeys([args.backend, "default"]):
        for expand in ([False, True] if shape[1] != shape[2] else [False]):
            res, err = None, "failed on another rank"
            try:
                res = run_one(cp_mesh, shape, T, backend, expand, args)
            except Exception as e:
                first = (str(e).strip().splitlines() or [""])[0][:160]
                err = f"{backend}{' k/v expanded' if expand else ''}: {type(e).__name__}: {first}"
                if cp_mesh is not None:
                    cp_cleanup()
            torch.cuda.empty_cache()
            if reduce(res is not None, dist.ReduceOp.MIN):
                return res[0], res[1], expand, errors
            errors.append(err)
    raise RuntimeError(" | ".join(errors))


def main():
    global NPROC
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[16384, 32768, 65536], help="tokens per GPU")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--shapes", default="mha,gqa", help="comma list of: " + ",".join(SHAPES))
    ap.add_argument("--world1", action="store_true", help="one-GPU baseline only, no process group")
    ap.add_argument("--backend", choices=list(BACKENDS), default="cudnn")
    ap.add_argument("--rotate", choices=["allgather", "alltoall"], default="allgather")
    ap.add_argument("--no-load-balance", action="store_true", help="contiguous shards, not head-tail")
    args = ap.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    cp_mesh, knobs = None, {}
    if not (args.world1 or int(os.environ.get("WORLD_SIZE", "1")) == 1):
        from torch.distributed.device_mesh import init_device_mesh
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        NPROC = dist.get_world_size()
        cp_mesh = init_device_mesh("cuda", (NPROC,), mesh_dim_names=("cp",))
        knobs = apply_knobs(args)
    W, dev = NPROC, torch.cuda.get_device_name()
    log = print if os.environ.get("RANK", "0") == "0" else (lambda *a, **k: None)
    what = "1 GPU only" if cp_mesh is None else f"torch context_parallel {json.dumps(knobs)} vs 1 GPU"
    log(f"# ring_torch_cp: {W} x {dev}, torch {torch.__version__}, {what}, SDPA backend {args.backend}, "
        f"bf16, causal, fwd+bwd, median of {args.reps} after {args.warmup} warm-up")
    log("| heads | tokens/GPU | 1 GPU TFLOP/s | CP TFLOP/s per GPU | efficiency | 1 GPU ms | CP ms | notes |\n"
        "|---|---|---|---|---|---|---|---|", flush=True)
    results = []
    for key in args.shapes.split(","):
        name, hq, hkv, hd = shape = SHAPES[key.strip()]
        for T in args.tokens:
            T -= T % 2  # head-tail sharding needs S divisible by 2 W
            r, notes = {"shape": name, "hq": hq, "hkv": hkv, "hd": hd, "tokens_per_gpu": T, "world": W}, []
            sides = [("one", None, "1 GPU", T, 1)] + ([("cp", cp_mesh, "CP", W * T, W)] if cp_mesh is not None else [])
            for side, mesh, who, S, share in sides:  # share: this GPU's part of the S-token sequence's work
                try:
                    t, label, expand, errs = measure(mesh, shape, T, args)
                except Exception as e:
                    r[f"{side}_error"] = str(e)
                    notes.append(f"{who} FAILED")
                    log(f"FAILED: {name} tokens/GPU {T} {who}: {e}", flush=True)
                    continue
                flops = 3.5 * 4.0 * S * S * hd * hq / 2.0 / share  # fwd + bwd (2.5 fwd), causal fwd 4 S^2 hd H / 2
                r.update({f"{side}_ms": 1e3 * t, f"{side}_tflops": flops / t / 1e12, f"{side}_backend": label,
                          f"{side}_kv_expanded": expand, f"{side}_fallbacks": errs})
                notes.append(f"{who} {label}" + (f" (k/v expanded to {hq} heads)" if expand else ""))
                for e in errs:
                    log(f"# fallback ({name}, {T}, {who}): {e}")
            r.update({"efficiency": r["cp_tflops"] / r["one_tflops"]} if "one_tflops" in r and "cp_tflops" in r else {})
            cell = lambda k, f: f.format(r[k]) if k in r else "-"
            log(f"| {name} | {T} | {cell('one_tflops', '{:.0f}')} | {cell('cp_tflops', '{:.0f}')} | "
                f"{cell('efficiency', '{:.0%}')} | {cell('one_ms', '{:.1f}')} | {cell('cp_ms', '{:.1f}')} | "
                f"{'; '.join(notes)} |", flush=True)
            results.append(r)
    log(json.dumps({"bench": "ring_torch_cp", "device": dev, "torch": torch.__version__, "world": W, "knobs": knobs,
                    "backend": args.backend, "reps": args.reps, "warmup": args.warmup, "results": results}), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
