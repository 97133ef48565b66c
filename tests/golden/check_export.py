#!/usr/bin/env python3
"""Checks that Hugging Face transformers loads easyctx's safetensors export and computes
the golden logits: python3 tests/golden/check_export.py EXPORT_DIR FIXTURE_DIR
(EXPORT_DIR/<name> written by test_golden with EASYCTX_GOLDEN_EXPORT=EXPORT_DIR)."""
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    export, fixtures = sys.argv[1], sys.argv[2]
    ok = True
    for name in ("gqa", "tied_llama3", "gqa_hd64", "qwen2", "qwen3", "yarn"):
        if not os.path.isdir(os.path.join(export, name)):  # a fixture not generated yet
            print(name, "not exported: skipped")
            continue
        model = AutoModelForCausalLM.from_pretrained(os.path.join(export, name), torch_dtype=torch.float64,
                                                 attn_implementation="eager")
        io = load_file(os.path.join(fixtures, name, "io.safetensors"))
        logits = model(input_ids=io["input_ids"].long(), position_ids=io["position_ids"].long()).logits
        err = ((logits - io["logits"]).norm() / io["logits"].norm()).item()
        print(name, type(model).__name__, "relative logits error", err, "rope",
              model.config.to_dict().get("rope_parameters"))
        ok = ok and err < 1e-5
    print("OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
