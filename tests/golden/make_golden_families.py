#!/usr/bin/env python3
"""Golden fixtures for the model families beyond Llama: tiny random Qwen2, Qwen3, Mistral and
YaRN- or dynamic-scaled Llamas in Hugging Face transformers, float64, in make_golden.py's format (the
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
  mistral       MistralForCausalLM, sliding_window 5 of the batch's 16 tokens in every layer
  qwen2_window  Qwen2ForCausalLM with use_sliding_window, sliding_window 4, max_window_layers 1:
                layer 0 full attention, layer 1 windowed
  dynamic_short LlamaForCausalLM with rope_type dynamic (factor 2), max_position_embeddings 256:
                the batch's positions (up to 52) stay below it, the plain frequencies
  dynamic_long  the same with max_position_embeddings 32: the forward's seq_len 53 is past it,
                so transformers rescales the base (inv_freq is saved after the forward)
Each script run asserts what makes the fixture test something: biases and norms present and
not trivial, the yarn frequencies and attention factor not the defaults, the windows changing
the logits (against the same weights without them; qwen2: per layer), the dynamic frequencies
the plain ones below max_position_embeddings and rescaled (as the formula in float64) past it.
"""
import argparse
import copy
import os
import sys

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

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
    if name == "mistral":
        cfg = MistralConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=8, tie_word_embeddings=False, sliding_window=5, **COMMON, **rope_kw(10000.0))
        return cfg, MistralForCausalLM
    if name == "qwen2_window":
        cfg = Qwen2Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                          tie_word_embeddings=False, use_sliding_window=True, sliding_window=4, max_window_layers=1,
                          **COMMON, **rope_kw(10000.0))
        return cfg, Qwen2ForCausalLM
    if name in ("dynamic_short", "dynamic_long"):
        common = dict(COMMON, max_position_embeddings=256 if name == "dynamic_short" else 32)
        cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8, tie_word_embeddings=False, attention_bias=False, mlp_bias=False, **common,
                          **rope_kw(10000.0, {"rope_type": "dynamic", "factor": 2.0}))
        return cfg, LlamaForCausalLM
    raise ValueError(name)


def dynamic_inv_freq(cfg, seq_len):
    """transformers' dynamic NTK frequencies in float64 (the check of the fixture; easyctx's
    test_golden wants transformers' float32 ones bit for bit)."""
    dim, m, f = cfg.head_dim, cfg.max_position_embeddings, 2.0
    base = 10000.0 * ((f * max(seq_len, m) / m) - (f - 1)) ** (dim / (dim - 2))
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def check_window(name, model, cfg, cls, ids, pos, logits):
    """The window changes the logits: the same weights without a window (and for qwen2 the
    window in every layer) give others."""
    def logits_with(**change):
        c = copy.deepcopy(cfg)
        for k, v in change.items():
            setattr(c, k, v)
        other = cls(c).to(torch.float64)
        other.load_state_dict(model.state_dict())
        with torch.no_grad():
            return other(input_ids=ids, position_ids=pos).logits
    if name == "qwen2_window":
        print(name, "layer_types", cfg.layer_types)
        assert cfg.layer_types == ["full_attention", "sliding_attention"], cfg.layer_types
        every = logits_with(layer_types=["sliding_attention"] * 2)
        assert (every - logits).abs().max().item() > 1e-3, "the window of layer 0 changed nothing"
    none = logits_with(sliding_window=None, use_sliding_window=False,
                       layer_types=["full_attention"] * cfg.num_hidden_layers)
    diff = (none - logits).abs().max().item()
    print(name, "max |windowed - full attention|", diff)
    assert diff > 1e-3, "the sliding window changed nothing"


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
    if name in ("mistral", "qwen2_window"):
        check_window(name, model, cfg, cls, ids, pos, logits.detach())
    if name.startswith("dynamic"):  # the frequencies this forward used (seq_len = the largest position + 1)
        seq_len = int(pos.max().item()) + 1
        inv = rot.inv_freq.detach().to(torch.float64).clone()
        want = dynamic_inv_freq(cfg, seq_len)
        err = ((inv - want).abs() / want).max().item()
        print(name, "seq_len", seq_len, "max_position_embeddings", cfg.max_position_embeddings, "inv_freq",
              inv.tolist(), "rel err against float64", err)
        assert err < 1e-6, "transformers' dynamic frequencies are not the formula's"
        dim = cfg.head_dim
        plain = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        rescaled = not torch.equal(inv.float(), plain)
        assert rescaled == (seq_len > cfg.max_position_embeddings), "dynamic rescaled at the wrong length"

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
    for name, seed in (("qwen2", 2020), ("qwen3", 3030), ("yarn", 4040), ("mistral", 5050), ("qwen2_window", 6060),
                       ("dynamic_short", 7070), ("dynamic_long", 7171)):
        if a.only and name not in a.only:
            continue
        build(name, a.out, seed)


if __name__ == "__main__":
    main()
