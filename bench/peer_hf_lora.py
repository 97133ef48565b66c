"""Peer baseline for LoRA: full training steps of a Hugging Face transformers model with LoRA
adapters on one GPU, what a user would pick instead of easyctx's LoRA (bench/run_lora.sh).

LlamaForCausalLM of ../shared/bench/peer_hf_llama.py's llama3-8b shape (GQA 32/8, 128K vocab;
random weights, bf16), frozen; LoRA rank R (alpha 2R) on q/k/v/o, with the token embedding and
every RMSNorm trainable (LongLoRA's recipe: PEFT's modules_to_save embed_tokens and norm), torch
SDPA (cuDNN or flash), gradient checkpointing, fused AdamW on the trainable parameters.
With PEFT importable: get_peft_model(LoraConfig(...)) (its adapters in float32, PEFT's default
autocast_adapter_dtype). Without it: LoRA layers written here (A Kaiming-uniform, B zero, the
same scale), the embedding and norms trained in place, bf16.
The loss: transformers' own (labels=) materialises [seq, vocab] float logits (32 GiB at 64K
tokens of a 128K vocabulary) and runs out of memory on an 80 GB GPU at 64K; --loss chunked (the
default) computes the LM head and cross entropy in checkpointed chunks of 8192 tokens instead,
as easyctx tiles it, so that the comparison is of the rest. Prints one JSON line per run:
median step and forward+backward time over the steps after the first, tokens/s, peak memory.
Run on a GPU host:  python3 bench/peer_hf_lora.py --runs llama3-8b:32768,llama3-8b:65536
"""
import argparse
import json
import math
import time

CONFIGS = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
}


def parse_runs(text):
    """'llama3-8b:32768,llama3-8b:65536' -> [(name, seq), ...]; ValueError naming a bad entry."""
    runs = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, seq = item.partition(":")
        if not sep or name not in CONFIGS or not seq.isdigit() or int(seq) < 2:
            raise ValueError(f"--runs: '{item}': expected MODEL:TOKENS with MODEL one of {', '.join(CONFIGS)}")
        runs.append((name, int(seq)))
    if not runs:
        raise ValueError("--runs: empty")
    return runs


def args_parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="llama3-8b:32768,llama3-8b:65536")
    ap.add_argument("--steps", type=int, default=3, help="timed steps after a warm-up step")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--sdpa", choices=["flash", "cudnn"], default="cudnn")
    ap.add_argument("--loss", choices=["chunked", "hf"], default="chunked")
    ap.add_argument("--no-peft", action="store_true", help="the LoRA layers written here even where PEFT imports")
    return ap


def lora_flops_per_token(c, seq, rank):
    """Model FLOPs per token of LoRA training, counted as easyctx's MFU counts them: frozen matmuls
    4 (forward and the input gradient), adapters 6, causal attention 6 L S q."""
    d, L, f, V = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
    hd = d // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    frozen = L * (d * q * 2 + d * kv * 2 + 3 * d * f) + d * V
    adapters = L * rank * ((d + q) + (d + kv) * 2 + (q + d))
    return 4 * frozen + 6 * adapters + 6 * seq * q * L


def add_lora(model, rank, alpha, use_peft):
    """The adapters and the trainable embedding and norms; returns (model, 'peft' or 'own')."""
    import sys
    import torch
    if use_peft:
        try:
            from peft import LoraConfig, get_peft_model
            cfg = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, task_type="CAUSAL_LM",
                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                             modules_to_save=["embed_tokens", "norm"])
            return get_peft_model(model, cfg), "peft"
        except Exception as e:  # not installed, or a PEFT that does not take this transformers
            print("peer_hf_lora: PEFT unusable (%s: %s); LoRA layers of this script instead" % (type(e).__name__, e),
                  file=sys.stderr)

    class LoraLinear(torch.nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base = base
            self.a = torch.nn.Parameter(torch.empty(rank, base.in_features, device=base.weight.device,
                                                    dtype=base.weight.dtype))
            self.b = torch.nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device,
                                                    dtype=base.weight.dtype))
            torch.nn.init.kaiming_uniform_(self.a, a=math.sqrt(5))
            self.scale = alpha / rank

        def forward(self, x):
            return self.base(x) + (x @ self.a.t() @ self.b.t()) * self.scale

    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.model.layers:
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(layer.self_attn, n, LoraLinear(getattr(layer.self_attn, n)))
    for name, p in model.named_parameters():
        if "embed_tokens" in name or "norm" in name:
            p.requires_grad_(True)
    return model, "own"


def chunked_loss(model, ids, chunk=8192):
    """Mean next-token NLL with the LM head and cross entropy in checkpointed chunks."""
    import torch
    from torch.utils.checkpoint import checkpoint
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    h = base.model(input_ids=ids).last_hidden_state[0, :-1]
    labels = ids[0, 1:]

    def part(x, y):
        return torch.nn.functional.cross_entropy(base.lm_head(x).float(), y, reduction="sum")

    total = sum(checkpoint(part, h[i:i + chunk], labels[i:i + chunk], use_reentrant=False)
                for i in range(0, h.shape[0], chunk))
    return total / labels.numel()


def run(name, seq, a):
    import torch
    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel
    c = CONFIGS[name]
    cfg = transformers.LlamaConfig(**c, max_position_embeddings=seq, rope_theta=1e6, torch_dtype=torch.bfloat16)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model, impl = add_lora(model, a.rank, 2 * a.rank, not a.no_peft)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    ids = torch.randint(0, c["vocab_size"], (1, seq), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[a.sdpa]
    times, fb = [], []
    with sdpa_kernel(backend):
        for i in range(a.steps + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = chunked_loss(model, ids) if a.loss == "chunked" else model(input_ids=ids, labels=ids).loss
            loss.backward()
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            if i > 0:
                times.append(time.perf_counter() - t0)
                fb.append(t1 - t0)
    t, tfb = sorted(times)[len(times) // 2], sorted(fb)[len(fb) // 2]
    flops = lora_flops_per_token(c, seq, a.rank)
    print(json.dumps(dict(system="peer_hf_lora", lora=impl, model=name, seq=seq, rank=a.rank, sdpa=a.sdpa,
                          loss_impl=a.loss, trainable=sum(p.numel() for p in params), step_s=round(t, 3),
                          fwd_bwd_s=round(tfb, 3), tokens_per_s=round(seq / t), fwd_bwd_tokens_per_s=round(seq / tfb),
                          model_tflops=round(seq / t * flops / 1e12, 1),
                          peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1), loss=float(loss.detach()))),
          flush=True)
    del model, opt, params
    torch.cuda.empty_cache()


def main(argv=None):
    a = args_parser().parse_args(argv)
    runs = parse_runs(a.runs)
    import torch
    for name, seq in runs:
        try:
            run(name, seq, a)
        except torch.OutOfMemoryError:
            print(json.dumps(dict(system="peer_hf_lora", model=name, seq=seq, error="OOM")), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
