"""The peer on packed documents: HF transformers training steps on one window of whole documents.

peer_hf_llama.py's model, optimizer and policy (random weights, gradient checkpointing, fused
AdamW, pure bf16) with two changes, so that the peer attends as easyctx's data.document_mask
does: position_ids restart at every document, and the attention is transformers'
`flex_attention`, which reads the restarts (masking_utils.find_packed_sequence_indices: no
attention_mask, position_ids given) and builds a block-sparse BlockMask, skipping the blocks
with no pair of tokens in one document. SDPA has no such form in transformers: given packed
position_ids it builds a dense boolean mask of seq x seq entries (16 GiB at 128K).
The window: documents of an easyctx shard (doc_offsets of DATA's .h5 files) placed
best-fit-decreasing into windows of the run's length, as easyctx's data.packing best_fit places
them; the window of median attention work is used. Its tail, if any, is padding in documents of
at most 1,024 tokens, as easyctx's loader cuts it. The label of each document's first token is
-100 (no target crosses a border).
Prints one JSON line per run: median step and forward+backward time, tokens/s (padding
counted, as easyctx counts it), the query-key pairs computed against a causal window's, model
TFLOP/s with the attention counted over those pairs, peak GPU memory.
  python3 peer_hf_packed.py --data SHARD_DIR --runs 7b:131072 [--steps 2]
  python3 peer_hf_packed.py --check     a small float32 model: packed logits against each
                                        document alone (the mask is what it says)
"""
import argparse, glob, json, os, sys, time
import torch
import transformers

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "bench")]
from peer_hf_llama import CONFIGS, model_flops_per_token  # noqa: E402


def shard_documents(path):
    import h5py
    files = sorted(glob.glob(os.path.join(path, "*.h5")))
    if not files:
        raise SystemExit(f"{path}: no .h5 shard files")
    lengths = []
    for f in files:
        with h5py.File(f, "r") as h:
            o = h["doc_offsets"][:]
        lengths += [int(n) for n in o[1:] - o[:-1]]
    return lengths


def packed_window(lengths, seq):
    """Best-fit decreasing: each document (longest first) into the fullest window it fits (a
    document longer than the window cut into window-sized pieces first); of the windows at
    least 95% full, the one of median attention work (sum of squared document lengths)."""
    pieces = []
    for n in lengths:
        while n > seq:
            pieces.append(seq)
            n -= seq
        pieces.append(n)
    bins = []  # [room, [lengths]]
    for n in sorted(pieces, reverse=True):
        fit = [b for b in bins if b[0] >= n]
        if fit:
            b = min(fit, key=lambda b: b[0])
        else:
            b = [seq, []]
            bins.append(b)
        b[0] -= n
        b[1].append(n)
    def share(b):
        return sum(n * n for n in b[1])
    full = sorted((b for b in bins if b[0] < seq // 20), key=share) or bins
    room, docs = full[len(full) // 2]  # the median window by attention work
    return docs + [1024] * (room // 1024) + ([room % 1024] if room % 1024 else [])  # padding


def packed_inputs(docs, vocab, device):
    pos = torch.cat([torch.arange(n) for n in docs]).unsqueeze(0).to(device)
    ids = torch.randint(0, vocab, pos.shape, device=device)
    labels = ids.clone()
    labels[pos == 0] = -100
    return ids, pos, labels


def build(name, seq, dtype, attn):
    c = dict(CONFIGS[name])
    family = c.pop("family", "Llama")
    cfg = getattr(transformers, family + "Config")(**c, max_position_embeddings=seq, rope_theta=1e6)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = getattr(transformers, family + "ForCausalLM")(cfg).to(dtype)
    model.config.use_cache = False
    return model, c


def run(name, seq, steps, lengths):
    docs = packed_window(lengths, seq)
    model, c = build(name, seq, torch.bfloat16, "flex_attention")
    model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids, pos, labels = packed_inputs(docs, c["vocab_size"], "cuda")
    torch.cuda.reset_peak_memory_stats()
    times, fb_times = [], []
    for i in range(steps + 1):  # the first step compiles flex attention and is not timed
        torch.cuda.synchronize(); t0 = time.perf_counter()
        loss = model(input_ids=ids, position_ids=pos, labels=labels).loss
        loss.backward()
        torch.cuda.synchronize(); tfb = time.perf_counter()
        opt.step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(); t1 = time.perf_counter()
        if i > 0:
            times.append(t1 - t0); fb_times.append(tfb - t0)
    times.sort(); fb_times.sort()
    t, tfb = times[len(times) // 2], fb_times[len(fb_times) // 2]
    pairs = sum(n * (n + 1) // 2 for n in docs)
    share = pairs / (seq * (seq + 1) / 2)
    d, L = c["hidden_size"], c["num_hidden_layers"]
    q = c["num_attention_heads"] * c.get("head_dim", d // c["num_attention_heads"])
    flops = model_flops_per_token(c, seq) - 6 * seq * q * L * (1 - share)  # attention over the pairs
    print(json.dumps(dict(model=name, seq=seq, attention="flex_attention, packed position_ids",
                          documents=len(docs), doc_min=min(docs), doc_max=max(docs), attention_share=round(share, 4),
                          step_s=round(t, 3), fwd_bwd_s=round(tfb, 3), tokens_per_s=round(seq / t),
                          fwd_bwd_tokens_per_s=round(seq / tfb), model_tflops=round(seq / t * flops / 1e12, 1),
                          peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1),
                          loss=float(loss.detach()))), flush=True)


def check():
    """Packed float32 logits against each document run alone (sdpa, plain causal)."""
    CONFIGS["check"] = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    docs = [300, 77, 1, 410, 235]
    packed, c = build("check", sum(docs), torch.float32, "flex_attention")
    alone, _ = build("check", sum(docs), torch.float32, "sdpa")
    alone.load_state_dict(packed.state_dict())
    ids, pos, _ = packed_inputs(docs, c["vocab_size"], "cuda")
    with torch.no_grad():
        got = packed(input_ids=ids, position_ids=pos).logits[0]
        want = torch.cat([alone(input_ids=x.unsqueeze(0)).logits[0] for x in ids[0].split(docs)])
        causal = alone(input_ids=ids).logits[0]
    err, scale = (got - want).abs().max().item(), want.abs().max().item()
    moved = (causal - want).abs().max().item()
    print(json.dumps(dict(check="packed flex_attention vs each document alone", documents=docs,
                          max_abs_err=err, max_abs_logit=scale, causal_window_differs_by=moved)), flush=True)
    if not err <= 1e-3 * scale or not moved > 100 * err:
        raise SystemExit("the packed peer does not mask documents")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="7b:131072")
    ap.add_argument("--steps", type=int, default=2, help="timed steps after the compiling one")
    ap.add_argument("--data", help="an easyctx shard folder (its doc_offsets give the documents)")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    if a.check:
        check()
        sys.exit(0)
    if not a.data:
        ap.error("--data SHARD_DIR is needed (or --check)")
    lengths = shard_documents(a.data)
    for r in a.runs.split(","):
        name, seq = r.split(":")
        try:
            run(name, int(seq), a.steps, lengths)
        except torch.OutOfMemoryError:
            print(json.dumps(dict(model=name, seq=int(seq), error="OOM")), flush=True)
            torch.cuda.empty_cache()
