#!/usr/bin/env bash
# The first hour of a new user, end to end: the README's `--print-config` example with a
# sequence-parallel size of 2 on one process; h5tokenize writing progress lines to a log file
# and its tokenizer/ folder; a run's Hugging Face export (final/) and easyctx_convert's carrying
# the tokenizer files AutoTokenizer needs (loaded with transformers when python3 has it);
# easyctx_eval_ppl --model RUN_DIR (its final/), with a clear message for a run without one
# and a missing folder; easyctx_convert printing "converted" only after success.
# With --autotokenizer as third argument: only the run and AutoTokenizer.from_pretrained(final/)
# (transformers), exit 77 where python3 has no transformers (Debian has no package for it; the
# GPU machine has it). The sentencepiece check of final/tokenizer.model runs in every mode.
set -euo pipefail
src=$1
bin=$2
mode=${3:-all}
# The python3 that has the Debian packages (python3-sentencepiece): /usr/bin/python3 when a
# pyenv or virtualenv python3 comes first on PATH without them.
PY=python3
if ! python3 -c "import sentencepiece" 2>/dev/null && [ -x /usr/bin/python3 ]; then PY=/usr/bin/python3; fi
if [ "$mode" = --autotokenizer ] && ! $PY -c "import transformers, sentencepiece" 2>/dev/null; then
  echo "SKIP: python3 cannot import transformers + sentencepiece: AutoTokenizer.from_pretrained(final/) not checked"
  exit 77
fi
work=$(mktemp -d /tmp/easyctx-first-hour.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; tail -20 "$work/out" 2>/dev/null; exit 1; }
pass() { echo "PASS $*"; }

source "$src/tests/tiny_data.sh"
tiny_chapters "$work" 60
tok=$(tiny_tokenizer "$work")

# h5tokenize into a log file: a progress line even though stderr is not a terminal.
"$bin/h5tokenize" --tokenizer "$tok" --output "$work/data" "$work/train.jsonl" >"$work/out" 2>"$work/h5tokenize.log" \
  || fail "h5tokenize failed"
grep -q "^\[h5tokenize\] .* docs .* tokens .*MB/s .*%" "$work/h5tokenize.log" || fail "no progress line in the log"
pass "h5tokenize prints progress lines to a log file"
for f in tokenizer.model tokenizer_config.json special_tokens_map.json; do
  [ -s "$work/data/tokenizer/$f" ] || fail "h5tokenize wrote no tokenizer/$f"
done
grep -q '"tokenizer_class": "LlamaTokenizer"' "$work/data/tokenizer/tokenizer_config.json" \
  || fail "tokenizer_config.json names no LlamaTokenizer"
grep -q '"bos_token": "<s>"' "$work/data/tokenizer/special_tokens_map.json" || fail "special_tokens_map.json: no <s>"
pass "h5tokenize keeps its tokenizer in <output>/tokenizer/"

{
  tiny_stage "$work/data" 64 3
  cat <<YAML
  batch_size: 1
output:
  dir: $work/run
YAML
} > "$work/stage.yaml"

# The README: build/bin/easyctx_train stage.yaml --set parallel.sequence.size=2 --print-config
"$bin/easyctx_train" "$work/stage.yaml" --set parallel.sequence.size=2 --print-config >"$work/out" 2>&1 \
  || fail "--print-config with parallel.sequence.size=2 on one process failed"
grep -q "sequence-parallel groups (1 x 2): \[0 1\]" "$work/out" || fail "--print-config: no 2-rank layout"
grep -q "smallest world for parallel.sequence.size = 2" "$work/out" || fail "--print-config: no note on the world"
grep -q "^  dir: " "$work/out" || fail "--print-config: no output.dir (slurm/common.sh reads it)"
grep -qE "^# this build: (CUDA backend, [0-9]+ CUDA device|CPU only)" "$work/out" \
  || fail "--print-config: no '# this build:' line (slurm/common.sh reads it)"
pass "--print-config with parallel.sequence.size=2 on one process"

"$bin/easyctx_train" "$work/stage.yaml" >"$work/out" 2>&1 || fail "training failed"
for f in config.json tokenizer.model tokenizer_config.json special_tokens_map.json; do
  [ -s "$work/run/final/$f" ] || fail "final/ has no $f"
done
grep -q "tokenizer: 3 tokenizer file(s)" "$work/out" || fail "the run does not log the tokenizer it exported"
pass "the run's final/ carries the tokenizer files"

# easyctx_convert: the tokenizer too; "converted" only once it is written.
"$bin/easyctx_convert" --from "ckpt:$work/run" --to "hf:$work/hf" >"$work/out" 2>&1 || fail "convert failed"
grep -q "^converted " "$work/out" || fail "convert: no 'converted' line"
[ -s "$work/hf/tokenizer.model" ] && [ -s "$work/hf/tokenizer_config.json" ] || fail "convert: no tokenizer files"
rc=0
"$bin/easyctx_convert" --from "ckpt:$work/nothing-here" --to "hf:$work/hf2" >"$work/out" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "convert from a missing checkpoint exited 0"
! grep -q "converted" "$work/out" || fail "convert printed 'converted' before failing"
pass "easyctx_convert exports the tokenizer and prints 'converted' only on success"

# final/tokenizer.model is the tokenizer h5tokenize used: sentencepiece (python3-sentencepiece,
# scripts/setup.sh) encodes a verse to the ids easyctx's own tokenizer wrote into the shards.
$PY - "$work/run/final" <<'PY' >"$work/out" 2>&1 || fail "final/tokenizer.model does not load in sentencepiece"
import json, sys
import sentencepiece as spm
d = sys.argv[1]
sp = spm.SentencePieceProcessor(model_file=d + "/tokenizer.model")
cfg = json.load(open(d + "/tokenizer_config.json"))
assert cfg["tokenizer_class"] == "LlamaTokenizer", cfg
assert sp.id_to_piece(sp.bos_id()) == "<s>", sp.bos_id()
ids = sp.encode("In the beginning God created the heaven and the earth.")
assert len(ids) > 3 and all(0 <= i < sp.get_piece_size() for i in ids), ids
PY
pass "final/tokenizer.model loads in sentencepiece with the config's LlamaTokenizer and <s>"

if [ "$mode" = --autotokenizer ]; then
  $PY - "$work/run/final" <<'PY' >"$work/out" 2>&1 || fail "AutoTokenizer.from_pretrained(final/) failed"
import sys
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained(sys.argv[1])
ids = t("In the beginning God created the heaven and the earth.")["input_ids"]
assert t.bos_token == "<s>" and ids[0] == t.bos_token_id, (t.bos_token, ids)
PY
  pass "AutoTokenizer.from_pretrained(final/)"
  exit 0
fi

# easyctx_eval_ppl --model RUN_DIR: the run's final/.
ppl=(--tokenized "$work/data" --min-tokens 32 --max-tokens 64 --tokens-step 32 --samples 2 --output-file "$work/ppl.csv")
"$bin/easyctx_eval_ppl" --model "$work/run" "${ppl[@]}" >"$work/out" 2>&1 || fail "eval --model RUN_DIR failed"
grep -q "evaluating its export $work/run/final" "$work/out" || fail "eval: does not say it uses final/"
[ "$(wc -l < "$work/ppl.csv")" -eq 3 ] || fail "eval: ppl.csv should have a header and 2 rows"
rm -rf "$work/run/final"
rc=0
"$bin/easyctx_eval_ppl" --model "$work/run" "${ppl[@]}" >"$work/out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "eval of a run without final/ exited $rc, expected 2"
grep -q "a training run without a final/ export" "$work/out" || fail "eval: no message for a run without final/"
grep -q "easyctx_convert --from ckpt:$work/run --to hf:OUT" "$work/out" || fail "eval: does not say how to export"
rc=0
"$bin/easyctx_eval_ppl" --model "$work/missing" "${ppl[@]}" >"$work/out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "eval of a missing folder exited $rc, expected 2"
grep -q "does not exist" "$work/out" || fail "eval: a missing folder is not reported as missing"
pass "easyctx_eval_ppl --model RUN_DIR"
echo "PASS: first-hour papercuts"
