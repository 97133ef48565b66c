#!/usr/bin/env python3
"""Checks easyctx's LoRA exports against Hugging Face transformers and PEFT:
python3 tests/golden/check_lora_export.py EXPORT_DIR FIXTURE_DIR
(written by test_golden's GoldenExport.LoraAdapterAndMergedGiveTheLoraLogits with
EASYCTX_GOLDEN_EXPORT=EXPORT_DIR):
  EXPORT_DIR/<name>-lora/merged          the PEFT adapter merged into the fixture's model
                                         (easyctx_convert --merge-lora's code)
  EXPORT_DIR/<name>-lora/adapter         the PEFT adapter folder (adapter_config.json,
                                         adapter_model.safetensors with PEFT's key names)
  EXPORT_DIR/<name>-lora.logits.safetensors  easyctx's logits of base + adapter (fp32)
For each fixture: AutoModelForCausalLM on the merged folder, and, where peft imports,
PeftModel.from_pretrained(the fixture's model, the adapter folder), both in float64, must give
easyctx's logits to 1e-5 relative. Exit 0 when every comparison that ran passed; prints
"PEFT: not importable" (and checks the merged models only) without peft."""
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

NAMES = ("gqa", "tied_llama3", "qwen2", "qwen3")


def logits_of(model, io):
    with torch.no_grad():
        return model(input_ids=io["input_ids"].long(), position_ids=io["position_ids"].long()).logits


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def main():
    export, fixtures = sys.argv[1], sys.argv[2]
    try:
        from peft import PeftModel
        import peft
        print("PEFT", peft.__version__)
    except Exception as e:  # not installed, or one that does not import beside this transformers
        PeftModel = None
        print("PEFT: not importable (%s: %s); checking the merged models only" % (type(e).__name__, e))
    ok = True
    for name in NAMES:
        out = os.path.join(export, name + "-lora")
        if not os.path.isdir(out):
            print(name, "MISSING: not exported")
            ok = False
            continue
        io = load_file(os.path.join(fixtures, name, "io.safetensors"))
        want = load_file(out + ".logits.safetensors")["logits"]
        merged = AutoModelForCausalLM.from_pretrained(os.path.join(out, "merged"), torch_dtype=torch.float64,
                                                      attn_implementation="eager")
        err = rel(logits_of(merged, io), want)
        print(name, "merged", type(merged).__name__, "relative logits error", err)
        ok = ok and err < 1e-5
        if PeftModel is None:
            continue
        base = AutoModelForCausalLM.from_pretrained(os.path.join(fixtures, name, "model"), torch_dtype=torch.float64,
                                                    attn_implementation="eager")
        model = PeftModel.from_pretrained(base, os.path.join(out, "adapter")).double().eval()
        err = rel(logits_of(model, io), want)
        print(name, "PeftModel.from_pretrained relative logits error", err)
        ok = ok and err < 1e-5
    print("OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
