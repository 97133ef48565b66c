#!/usr/bin/env bash
# Prints the path of the demo's tokenizer: a 2000-piece Llama-style SentencePiece BPE
# (byte fallback, split digits, BOS 1, EOS 2) trained with spm_train on the KJV verses into
# OUTDIR/kjv_bpe2000.model. configs/models/demo.yaml has vocab_size 2000 to match.
# Idempotent (about a second). No third-party tokenizer file is needed.
set -euo pipefail
out=${1:?usage: make_demo_tokenizer.sh OUTDIR}
mkdir -p "$out"
model="$out/kjv_bpe2000.model"
if [ ! -s "$model" ]; then
  command -v spm_train >/dev/null || { echo "make_demo_tokenizer.sh: spm_train not found (apt-get install sentencepiece)" >&2; exit 1; }
  command -v bible >/dev/null || { echo "make_demo_tokenizer.sh: bible not found (apt-get install bible-kjv)" >&2; exit 1; }
  if [ ! -s "$out/kjv.txt" ]; then  # verse texts, one per line (as make_kjv_corpus.sh writes them)
    bible -f gen1:1-rev22:21 | sed -nE 's/^[^ ]+[0-9]+:[0-9]+ //p' > "$out/kjv.txt.tmp"
    mv "$out/kjv.txt.tmp" "$out/kjv.txt"
  fi
  # Llama-style options (../shared/reference/data-and-eval.md 5c).
  spm_train --input="$out/kjv.txt" --model_prefix="$out/kjv_bpe2000.tmp" --vocab_size=2000 --model_type=bpe \
    --byte_fallback=true --character_coverage=1.0 --split_digits=true --allow_whitespace_only_pieces=true \
    --normalization_rule_name=identity --add_dummy_prefix=true --remove_extra_whitespaces=false \
    --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 --num_threads=2 --minloglevel=2 >&2 2>/dev/null
  mv "$out/kjv_bpe2000.tmp.model" "$model"
  mv "$out/kjv_bpe2000.tmp.vocab" "$out/kjv_bpe2000.vocab"
fi
echo "$(cd "$out" && pwd)/kjv_bpe2000.model"
