#!/usr/bin/env python3
"""Golden fixtures for the model families beyond Llama: tiny random Qwen2, Qwen3 and a
YaRN-scaled Llama in Hugging Face transformers, float64, in make_golden.py's format (the
model folder; io.safetensors with input_ids, position_ids, labels, logits, loss, inv_freq and
grad.<hf name> of every parameter).

Run where torch + transformers exist (CPU torch is fine):
    python3 tests/golden/make_golden_families.py --out tests/golden/data [--only NAME]

Fixtures:
  qwen2  Qwen2ForCausalLM: q/k/v biases (random, not zero), GQA 4/2, untied, no window
  qwen3  Qwen3ForCausalLM: per-head q/k RMSNorm, head_dim 12 with hidden 32 (q width 48 !=
         hidden), GQA 4/2, tied embeddings
  yarn   LlamaForCausalLM with rope_type yarn, factor 4 from max_position_embeddings 256 over
         original_max_position_embeddings 64 (HF's rule), the default attention factor
Each script run asserts what makes the fixture test something: biases and norms present and
not trivial, the yarn frequencies and attention factor not the defaults.
"""
import argparse
import os
import sys

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import golden_batch, random_model, save  # noqa: E402  (the same weights and file format)

V5 = int(transformers.__version__.split(".")[0]) >= 5
COMMON = dict(num_hidden_layers=2, vocab_size=128, max_position_embeddings=256, rms_norm_eps=1e-6,
              bos_token_id=1, eos_token_id=2, hidden_act="silu")


def rope_kw(theta, scaling=None):
    if V5:
        return {"rope_parameters": dict(scaling or {"rope_type": "default"}, rope_theta=theta)}
    return {"rope_theta": theta, "rope_scaling": scaling}


def make(name):
    if name == "qwen2":
        cfg = Qwen2Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                          tie_word_embeddings=False, use_sliding_window=False, **COMMON, **rope_kw(10000.0))
        return cfg, Qwen2ForCausalLM
    if name == "qwen3":
        cfg = Qwen3Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=12, tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
                          **COMMON, **rope_kw(10000.0))
        return cfg, Qwen3ForCausalLM
    if name == "yarn":
        yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
        cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8, tie_word_embeddings=False, attention_bias=False, mlp_bias=False, **COMMON,
                          **rope_kw(10000.0, yarn))
        return cfg, LlamaForCausalLM
    raise ValueError(name)


def build(name, out, seed, wstd=0.25):
    torch.manual_seed(seed)
    cfg, cls = make(name)
    model = random_model(cfg, wstd, cls)
    names = [n for n, _ in model.named_parameters()]
    rot = model.model.rotary_emb
    inv = rot.inv_freq.detach().to(torch.float64).clone()
    if name == "qwen2":
        assert any(n.endswith("q_proj.bias") for n in names), names
    if name == "qwen3":
        assert any(n.endswith("self_attn.q_norm.weight") for n in names), names
    if name == "yarn":
        dim = cfg.head_dim
        default = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        assert not torch.allclose(inv.float(), default), "yarn did not change the frequencies"
        assert abs(rot.attention_scaling - 1.0) > 1e-3, rot.attention_scaling

    Vv = cfg.vocab_size
    ids, pos, labels = golden_batch(Vv)
    logits = model(input_ids=ids, position_ids=pos).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, Vv), labels.reshape(-1), ignore_index=-100)
    loss.backward()

    d = os.path.join(out, name)
    os.makedirs(os.path.join(d, "model"), exist_ok=True)
    save(d, model, ids, pos, labels, logits, loss, inv)
    print(name, "loss", loss.item(), "params", sum(p.numel() for p in model.parameters()), "attention_scaling",
          getattr(rot, "attention_scaling", 1.0), "transformers", transformers.__version__, "torch",
          torch.__version__)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", action="append", help="build only these fixtures (repeatable)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    for name, seed in (("qwen2", 2020), ("qwen3", 3030), ("yarn", 4040)):
        if a.only and name not in a.only:
            continue
        build(name, a.out, seed)


if __name__ == "__main__":
    main()
