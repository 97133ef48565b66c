#!/usr/bin/env python3
"""Checks that Hugging Face transformers loads easyctx_convert's output and reproduces the
golden logits: python3 tests/golden/check_convert.py CONVERTED_DIR FIXTURE_DIR
CONVERTED_DIR/<name>-<dtype> are easyctx_convert --to hf outputs of the fixture models
(hf -> ckpt -> hf); f32 must match to 1e-5, bf16 to 2e-2 (bf16 weight rounding)."""
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM


def main():
    converted, fixtures = sys.argv[1], sys.argv[2]
    ok = True
    for name in ("gqa", "tied_llama3", "gqa_hd64"):
        io = load_file(os.path.join(fixtures, name, "io.safetensors"))
        for dtype, tol in (("f32", 1e-5), ("bf16", 2e-2)):
            path = os.path.join(converted, f"{name}-{dtype}")
            model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float64, attn_implementation="eager")
            logits = model(input_ids=io["input_ids"].long(), position_ids=io["position_ids"].long()).logits
            err = ((logits - io["logits"]).norm() / io["logits"].norm()).item()
            good = err < tol
            ok = ok and good
            print(f"{name} {dtype}: relative logits error {err:.3e} (tolerance {tol}) {'ok' if good else 'MISMATCH'}")
    print("OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
