#!/usr/bin/env python3
"""Checks that Hugging Face transformers loads easyctx's safetensors exports and computes
easyctx's logits: python3 tests/golden/check_export.py EXPORT_DIR FIXTURE_DIR
(written by test_golden with EASYCTX_GOLDEN_EXPORT=EXPORT_DIR):
  EXPORT_DIR/<name>            the fixture model imported and exported: the golden logits
  EXPORT_DIR/<name>-trained    imported, trained 3 AdamW steps by easyctx (fp32 CPU), exported:
                               easyctx's logits of the trained model, <name>-trained.logits.safetensors
Every fixture named below must be there (a missing export is a failure; mistral, qwen2_window,
dynamic_short and dynamic_long where FIXTURE_DIR has them, as test_golden); relative logits
error below 1e-5 (easyctx computes in fp32, transformers here in float64)."""
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    export, fixtures = sys.argv[1], sys.argv[2]
    ok = True
    more = [n for n in ("mistral", "qwen2_window", "dynamic_short", "dynamic_long")
            if os.path.isfile(os.path.join(fixtures, n, "io.safetensors"))]
    runs = [(n, n) for n in ["gqa", "tied_llama3", "gqa_hd64", "qwen2", "qwen3", "yarn"] + more]
    runs += [(n, n + "-trained") for n in ["gqa", "tied_llama3", "qwen2", "qwen3", "yarn"] + more]
    for name, folder in runs:
        path = os.path.join(export, folder)
        if not os.path.isdir(path):
            print(folder, "MISSING: not exported")
            ok = False
            continue
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float64, attn_implementation="eager")
        io = load_file(os.path.join(fixtures, name, "io.safetensors"))
        want = io["logits"] if folder == name else load_file(path + ".logits.safetensors")["logits"]
        with torch.no_grad():
            logits = model(input_ids=io["input_ids"].long(), position_ids=io["position_ids"].long()).logits
        err = ((logits - want).norm() / want.norm()).item()
        moved = "" if folder == name else " (the trained logits differ from the fixture's by %.3g)" % (
            ((want - io["logits"]).norm() / io["logits"].norm()).item())
        print(folder, type(model).__name__, "relative logits error", err, "rope",
              model.config.to_dict().get("rope_parameters"), moved)
        ok = ok and err < 1e-5
    print("OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
