#!/usr/bin/env bash
# Prints the path of the context-extension experiment's tokenizer (bench/run_extension.sh,
# docs/results.md): a Llama-style SentencePiece BPE (byte fallback, split digits, BOS 1,
# EOS 2) of VOCAB pieces (default 4096) trained with spm_train on the training blocks of a
# corpus that scripts/make_text_corpus.py made, never on its held-out blocks: every 8th
# non-empty line of CORPUS/train/*.txt in name order (deterministic). Writes
# OUTDIR/text_bpe<VOCAB>.model. Idempotent (10-20 s on 2 cores for the whole corpus).
#
#   bash scripts/make_text_tokenizer.sh CORPUS OUTDIR [VOCAB]
set -euo pipefail
corpus=${1:?usage: make_text_tokenizer.sh CORPUS OUTDIR [VOCAB]}
out=${2:?usage: make_text_tokenizer.sh CORPUS OUTDIR [VOCAB]}
vocab=${3:-4096}
mkdir -p "$out"
model="$out/text_bpe$vocab.model"
if [ ! -s "$model" ]; then
  command -v spm_train > /dev/null || { echo "make_text_tokenizer.sh: spm_train not found (apt-get install sentencepiece)" >&2; exit 1; }
  ls "$corpus"/train/*.txt > /dev/null 2>&1 || { echo "make_text_tokenizer.sh: no $corpus/train/*.txt (scripts/make_text_corpus.py makes them)" >&2; exit 1; }
  LC_ALL=C ls "$corpus"/train/*.txt | LC_ALL=C sort | xargs cat | awk 'NF > 0 && ++n % 8 == 0' > "$out/spm_sample.txt"
  # Llama-style options, as scripts/make_demo_tokenizer.sh (../shared/reference/data-and-eval.md 5c).
  # Run in OUTDIR with relative names: the model file records them, so it is the same file
  # (the same sha256, which shards record) whatever OUTDIR is.
  (cd "$out" && spm_train --input=spm_sample.txt --model_prefix="text_bpe$vocab.tmp" --vocab_size="$vocab" \
    --model_type=bpe --byte_fallback=true --character_coverage=1.0 --split_digits=true \
    --allow_whitespace_only_pieces=true --normalization_rule_name=identity --add_dummy_prefix=true \
    --remove_extra_whitespaces=false --max_sentence_length=16384 --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 \
    --num_threads=2 --minloglevel=2 > /dev/null 2>&1)
  mv "$out/text_bpe$vocab.tmp.model" "$model"
  mv "$out/text_bpe$vocab.tmp.vocab" "$out/text_bpe$vocab.vocab"
  rm -f "$out/spm_sample.txt"
fi
echo "$(cd "$out" && pwd)/text_bpe$vocab.model"
