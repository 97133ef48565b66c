#!/usr/bin/env bash
# The built-in demo: set up, build, make a KJV mini-SlimPajama (one document per chapter),
# train a 2000-piece SentencePiece tokenizer on it, tokenize with h5tokenize (Revelation's
# 22 chapters held out), train configs/demo.yaml from random init (CPU when there is no GPU),
# then measure perplexity on the held-out chapters with easyctx_eval_ppl.
# Extra arguments go to easyctx_train (e.g. --set train.steps=50).
set -euo pipefail
# Spin-waiting OpenMP threads starve MPI ranks that share cores; results do not depend on it.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
OUT=out/demo
mkdir -p "$OUT/text"
bash scripts/make_kjv_corpus.sh "$OUT/corpus"
tok=$(bash scripts/make_demo_tokenizer.sh "$OUT/tokenizer")
if [ ! -s "$OUT/text/heldout.jsonl" ]; then
  zstd -q -d -c "$OUT/corpus/kjv_chapters.jsonl.zst" > "$OUT/text/chapters.jsonl"
  head -n -22 "$OUT/text/chapters.jsonl" > "$OUT/text/train.jsonl"
  tail -n 22 "$OUT/text/chapters.jsonl" > "$OUT/text/heldout.jsonl"
fi
mpirun_flags=(-np "${NP:-1}" --bind-to none)
[ "$(id -u)" -eq 0 ] && mpirun_flags+=(--allow-run-as-root --oversubscribe)
build/bin/h5tokenize --tokenizer "$tok" --output "$OUT/data" "$OUT/text/train.jsonl"
build/bin/h5tokenize --tokenizer "$tok" --output "$OUT/heldout" "$OUT/text/heldout.jsonl"
# scripts/mpirun.sh: Ctrl-C commits a checkpoint and stops (plain mpirun kills the ranks).
bash scripts/mpirun.sh "${mpirun_flags[@]}" build/bin/easyctx_train configs/demo.yaml --resume none "$@"
build/bin/easyctx_eval_ppl --model "$OUT/run/final" --tokenized "$OUT/heldout" \
  --min-tokens 128 --max-tokens 512 --tokens-step 128 --samples 16 --output-file "$OUT/ppl.csv"
echo "demo: perplexity of the held-out chapters (Revelation) by context length, $OUT/ppl.csv:"
cat "$OUT/ppl.csv"
