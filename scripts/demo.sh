#!/usr/bin/env bash
# The built-in demo: set up, build, make a KJV mini-SlimPajama, train a SentencePiece
# tokenizer on it, tokenize with h5tokenize, train configs/demo.yaml (CPU when there is no
# GPU), then measure perplexity on held-out text with easyctx_eval_ppl.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
OUT=out/demo
mkdir -p "$OUT"
bash scripts/make_kjv_corpus.sh "$OUT/corpus"
tok=$(bash scripts/make_demo_tokenizer.sh "$OUT/tokenizer" "$OUT/corpus")
np=${NP:-1}
mpirun_flags=(-np "$np" --bind-to none)
[ "$(id -u)" -eq 0 ] && mpirun_flags+=(--allow-run-as-root --oversubscribe)
mpirun "${mpirun_flags[@]}" build/bin/h5tokenize --tokenizer "$tok" --output "$OUT/data" "$OUT/corpus/train"
mpirun "${mpirun_flags[@]}" build/bin/h5tokenize --tokenizer "$tok" --output "$OUT/heldout" "$OUT/corpus/heldout"
mpirun "${mpirun_flags[@]}" build/bin/easyctx_train configs/demo.yaml "$@"
build/bin/easyctx_eval_ppl --model "$OUT/run/final" --tokenized "$OUT/heldout" \
  --min-tokens 128 --max-tokens 512 --tokens-step 128 --samples 8 --output-file "$OUT/ppl.csv"
echo "demo: perplexity by context length (out/demo/ppl.csv):"
cat "$OUT/ppl.csv"
