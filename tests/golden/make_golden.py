#!/usr/bin/env python3
"""Golden fixtures for easyctx's CPU model: a tiny random Llama (GQA) in Hugging Face
transformers, float64, with its inputs, logits, loss and every parameter's gradient.

Run where torch + transformers exist (CPU torch is fine):
    python3 tests/golden/make_golden.py --out tests/golden/data

Writes, per fixture NAME:
  NAME/model/config.json, NAME/model/model.safetensors   the model (F32 on disk; every
                                                        weight is exactly representable)
  NAME/io.safetensors   F64 tensors: input_ids, position_ids, labels ([B, S]; label -1 =
                        ignored), logits [B, S, V], loss [1] (mean NLL over labelled tokens),
                        inv_freq [head_dim/2] (HF's RoPE frequencies), and grad.<hf name>
                        for every parameter (d loss / d parameter).
Fixtures: gqa (untied, default RoPE, rope_theta 10000), tied_llama3 (tied embeddings,
rope_scaling llama3 chosen so the high, medium and low frequency branches all occur) and
gqa_hd64 (head_dim 64, the smallest a CUDA attention kernel takes: 2 query heads on 1 kv
head, weights of std 0.1 so attention logits stay near unit scale as in a trained model,
for the bf16 CUDA model's golden check; made on a GPU host, 2026-11-30), and packed (the gqa
shape, two sequences each packed with 3-4 documents of odd lengths: position_ids restarting per
document, a 4D block-diagonal causal mask, and doc_starts, I64 [B, 4] padded with -1, for
data.document_mask; made on a GPU host, 2026-12-05).
Fixtures already in --out are kept unless named with --only (a newer torch may draw
different random numbers).
"""
import argparse
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

V5 = int(transformers.__version__.split(".")[0]) >= 5


def make_config(tied, llama3, hd64=False):
    shape = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    if hd64:
        shape = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                     head_dim=64)
    kw = dict(num_hidden_layers=2, vocab_size=128, max_position_embeddings=256, **shape,
              rms_norm_eps=1e-5, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2,
              attention_bias=False, mlp_bias=False, hidden_act="silu")
    rope = {"rope_type": "default"}
    if llama3:
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}
    theta = 10000.0 if not llama3 else 5000.0
    if V5:
        kw["rope_parameters"] = dict(rope, rope_theta=theta)
    else:
        kw["rope_theta"] = theta
        kw["rope_scaling"] = None if not llama3 else rope
    return LlamaConfig(**kw)


def random_model(cfg, wstd, cls=LlamaForCausalLM):
    """`cls` (LlamaForCausalLM or another family's) in float64 (eager attention) with random
    weights exact in F32: norm gains 1 + 0.2 N(0, 1), everything else (biases too) wstd N(0, 1)."""
    cfg._attn_implementation = "eager"
    model = cls(cfg).to(torch.float64)
    model.train()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight") or "layernorm" in pname:
                v = 1.0 + 0.2 * torch.randn(p.shape, dtype=torch.float64)
            else:
                v = wstd * torch.randn(p.shape, dtype=torch.float64)
            p.copy_(v.to(torch.float32).to(torch.float64))  # exact in F32 on disk
    return model


def golden_batch(Vv, B=2, S=16):
    """Random ids and labels (three of them -100, ignored), positions 0.. and 37.. (row 1:
    explicit offset positions)."""
    ids = torch.randint(0, Vv, (B, S))
    pos = torch.stack([torch.arange(S), torch.arange(S) + 37])
    labels = torch.randint(0, Vv, (B, S))
    labels[0, 3] = -100
    labels[1, 0] = -100
    labels[1, 9] = -100
    return ids, pos, labels


def build(name, out, tied, llama3, seed, hd64=False, wstd=0.25):
    torch.manual_seed(seed)
    cfg = make_config(tied, llama3, hd64)
    model = random_model(cfg, wstd)
    inv = model.model.rotary_emb.inv_freq.detach().to(torch.float64).clone()
    if llama3:
        default = 1.0 / (cfg_theta(cfg) ** (torch.arange(0, 8, 2, dtype=torch.int64).float() / 8))
        assert not torch.allclose(inv.float(), default), "llama3 rope scaling was not applied"

    Vv = cfg.vocab_size
    ids, pos, labels = golden_batch(Vv)
    out_ = model(input_ids=ids, position_ids=pos)
    logits = out_.logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, Vv), labels.reshape(-1), ignore_index=-100)
    loss.backward()

    d = os.path.join(out, name)
    os.makedirs(os.path.join(d, "model"), exist_ok=True)
    save(d, model, ids, pos, labels, logits, loss, inv)
    print(name, "loss", loss.item(), "params", sum(p.numel() for p in model.parameters()),
          "transformers", transformers.__version__, "torch", torch.__version__)
    # transformers' own bf16 run against this float64 one: the noise floor of a bf16 model on
    # this fixture (printed for the record; the CUDA test's tolerances sit above it).
    ref = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    mb = LlamaForCausalLM(cfg).to(torch.bfloat16)
    mb.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    mb.train()
    lb = torch.nn.functional.cross_entropy(mb(input_ids=ids, position_ids=pos).logits.float().reshape(-1, Vv),
                                           labels.reshape(-1), ignore_index=-100)
    lb.backward()
    worst = max(((pb.grad.double() - ref[n]).norm() / ref[n].norm()).item() for n, pb in mb.named_parameters())
    print(name, "transformers bf16 vs float64: loss rel err", abs(lb.item() - loss.item()) / abs(loss.item()),
          "worst gradient rel err", worst)


def save(d, model, ids, pos, labels, logits, loss, inv, extra=None):
    """io.safetensors (F64 inputs, outputs and gradients; `extra` as given) and the model."""
    io = {
        "input_ids": ids.to(torch.float64),
        "position_ids": pos.to(torch.float64),
        "labels": torch.where(labels < 0, torch.full_like(labels, -1), labels).to(torch.float64),
        "logits": logits.detach().contiguous(),
        "loss": loss.detach().reshape(1),
        "inv_freq": inv.contiguous(),
    }
    io.update(extra or {})
    for pname, p in model.named_parameters():
        io["grad." + pname] = p.grad.detach().contiguous()
    save_file(io, os.path.join(d, "io.safetensors"))
    model.to(torch.float32).save_pretrained(os.path.join(d, "model"), safe_serialization=True)


def document_mask(starts, S, boolean):
    """[B, 1, S, S] block-diagonal causal mask: query i sees key j <= i of its own document.
    boolean: True = attend; else additive float64 (0 or the most negative float64)."""
    B = len(starts)
    doc = torch.zeros(B, S, dtype=torch.int64)
    for b, st in enumerate(starts):
        for s in st[1:]:
            doc[b, s:] += 1
    i = torch.arange(S)
    ok = (doc[:, :, None] == doc[:, None, :]) & (i[None, :, None] >= i[None, None, :])
    ok = ok[:, None]
    if boolean:
        return ok
    return torch.full(ok.shape, torch.finfo(torch.float64).min, dtype=torch.float64).masked_fill(ok, 0.0)


def build_packed(name, out, seed):
    """Two sequences of 23 tokens, each packed with 3-4 documents of odd lengths: position_ids
    restart at 0 per document and a 4D block-diagonal causal mask keeps attention inside each
    document. Checked here: every document's logits equal the same document run alone, and
    differ from plain causal attention over the whole sequence. Writes doc_starts (I64
    [B, 4], each sequence's document starts padded with -1) beside the usual tensors."""
    torch.manual_seed(seed)
    cfg = make_config(False, False)
    model = random_model(cfg, 0.25)
    inv = model.model.rotary_emb.inv_freq.detach().to(torch.float64).clone()
    lengths = [[5, 1, 9, 8], [11, 3, 9]]
    B, S, Vv = len(lengths), sum(lengths[0]), cfg.vocab_size
    starts = [[sum(l[:k]) for k in range(len(l))] for l in lengths]
    ids = torch.randint(0, Vv, (B, S))
    pos = torch.stack([torch.cat([torch.arange(n) for n in l]) for l in lengths])
    labels = torch.randint(0, Vv, (B, S))
    for b, st in enumerate(starts):  # as the loader: no label predicts the next document's first token
        for s in st[1:]:
            labels[b, s - 1] = -100
    labels[1, 7] = -100
    alone = [[model(input_ids=ids[b:b + 1, s:s + n], position_ids=torch.arange(n)[None]).logits[0].detach()
              for s, n in zip(starts[b], lengths[b])] for b in range(B)]
    causal = torch.stack([document_mask([[0]], S, False)[0]] * B)
    plain = model(input_ids=ids, position_ids=pos, attention_mask=causal).logits.detach()
    # The additive float mask is eager attention's own form (transformers 5.17 reads a 4D bool
    # mask otherwise). HF's eager attention takes its softmax in float32 even for a float64
    # model, so packed and alone agree to float32 rounding (2e-6 measured), not exactly: the
    # bound 1e-5 is the golden test's own tolerance on logits.
    mask = document_mask(starts, S, False)
    with torch.no_grad():
        got = model(input_ids=ids, position_ids=pos, attention_mask=mask).logits
    err = max((got[b, s:s + n] - alone[b][k]).abs().max().item()
              for b in range(B) for k, (s, n) in enumerate(zip(starts[b], lengths[b])))
    print(name, "mask float64 additive, attention", model.config._attn_implementation,
          "max |packed - alone|", err)
    assert err < 1e-5, "the 4D document mask was not applied as a mask"
    logits = model(input_ids=ids, position_ids=pos, attention_mask=mask).logits
    diff = (logits.detach() - plain).abs().max().item()
    print(name, "max |masked - plain causal|", diff)
    assert diff > 1e-3, "plain causal attention gave the masked logits: the documents do not matter"
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, Vv), labels.reshape(-1), ignore_index=-100)
    loss.backward()
    d = os.path.join(out, name)
    os.makedirs(os.path.join(d, "model"), exist_ok=True)
    doc_starts = torch.full((B, 4), -1, dtype=torch.int64)
    for b, st in enumerate(starts):
        doc_starts[b, :len(st)] = torch.tensor(st)
    save(d, model, ids, pos, labels, logits, loss, inv, {"doc_starts": doc_starts})
    print(name, "loss", loss.item(), "doc_starts", starts, "transformers", transformers.__version__,
          "torch", torch.__version__)


def cfg_theta(cfg):
    if V5:
        return cfg.rope_parameters["rope_theta"]
    return cfg.rope_theta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", action="append", help="build only these fixtures (repeatable)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    fixtures = {
        "gqa": dict(tied=False, llama3=False, seed=1234),
        "tied_llama3": dict(tied=True, llama3=True, seed=4321),
        "gqa_hd64": dict(tied=False, llama3=False, seed=6464, hd64=True, wstd=0.1),
    }
    for name, kw in fixtures.items():
        if a.only and name not in a.only:
            continue
        build(name, a.out, **kw)
    if not a.only or "packed" in a.only:
        build_packed("packed", a.out, seed=4242)
    for root, _, files in os.walk(a.out):
        for f in files:
            p = os.path.join(root, f)
            print(p, os.path.getsize(p))


if __name__ == "__main__":
    main()
