# Sourced by the shell tests: the tiny KJV data they train and evaluate on, made one way.
#
#   source "$src/tests/tiny_data.sh"
#   tok=$(tiny_data "$bin" "$work" 60)   # corpus, tokenizer, first 60 chapters, shard
#
# tiny_data BIN DIR CHAPTERS     the three below: DIR/corpus/ (scripts/make_kjv_corpus.sh),
#                                DIR/chapters.jsonl (all 1,189 chapters), DIR/train.jsonl (the
#                                first CHAPTERS), DIR/tok/ (the demo tokenizer) and DIR/data/
#                                (train.jsonl tokenized by BIN/h5tokenize); prints the
#                                tokenizer's path
# tiny_tokenizer DIR             the demo tokenizer in DIR/tok/ (scripts/make_demo_tokenizer.sh,
#                                also leaving DIR/tok/kjv.txt, the verses); prints its path
# tiny_chapters DIR CHAPTERS     DIR/corpus/, DIR/chapters.jsonl and DIR/train.jsonl
# tiny_shard BIN TOK INPUT OUT   BIN/h5tokenize of INPUT with tokenizer TOK into the folder OUT
# tiny_stage DATA SEQ STEPS      the start of a stage YAML: the demo model trained on the shards
#                                in DATA, SEQ-token windows, STEPS steps; it ends inside train:,
#                                so a test goes on with more train keys or its own sections
# tiny_mpirun                    the two-rank launch of the shell tests, as arrays: mpi_args
#                                (-np 2 --bind-to none, plus --allow-run-as-root --oversubscribe
#                                as root, which Open MPI otherwise refuses) and mpi (mpirun and
#                                those arguments)
#
# Each returns non-zero after one line on stderr naming the step that failed (and, for
# h5tokenize, the end of its output), so a test stops at the cause: `tok=$(tiny_data ...)`
# under `set -e`, or `|| fail ...` without it. Nothing else goes to stdout or stderr.

_tiny_data_src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

tiny_stage() {
  cat <<YAML
model:
  config: demo
data:
  path: $1
  seq_length: $2
train:
  steps: $3
YAML
}

tiny_mpirun() {
  mpi_args=(-np 2 --bind-to none)
  [ "$(id -u)" -ne 0 ] || mpi_args+=(--allow-run-as-root --oversubscribe)
  mpi=(mpirun "${mpi_args[@]}")
}

tiny_tokenizer() {
  local dir=${1:?usage: tiny_tokenizer DIR} tok
  tok=$(bash "$_tiny_data_src/scripts/make_demo_tokenizer.sh" "$dir/tok") ||
    { echo "tiny_data: scripts/make_demo_tokenizer.sh $dir/tok failed (see its message above)" >&2; return 1; }
  echo "$tok"
}

tiny_chapters() {
  local dir=${1:?usage: tiny_chapters DIR CHAPTERS} n=${2:?usage: tiny_chapters DIR CHAPTERS}
  bash "$_tiny_data_src/scripts/make_kjv_corpus.sh" "$dir/corpus" >/dev/null ||
    { echo "tiny_data: scripts/make_kjv_corpus.sh $dir/corpus failed (see its message above)" >&2; return 1; }
  zstd -q -d -f -o "$dir/chapters.jsonl" "$dir/corpus/kjv_chapters.jsonl.zst" ||
    { echo "tiny_data: zstd could not decompress $dir/corpus/kjv_chapters.jsonl.zst" >&2; return 1; }
  head -n "$n" "$dir/chapters.jsonl" > "$dir/train.jsonl" ||
    { echo "tiny_data: could not write $dir/train.jsonl" >&2; return 1; }
  [ "$(wc -l < "$dir/train.jsonl")" -eq "$n" ] ||
    { echo "tiny_data: $dir/train.jsonl has $(wc -l < "$dir/train.jsonl") chapters, $n asked for" >&2; return 1; }
}

tiny_shard() {
  local bin=${1:?usage: tiny_shard BIN TOK INPUT OUT} tok=${2:?} input=${3:?} out=${4:?} log
  [ -x "$bin/h5tokenize" ] || { echo "tiny_data: $bin/h5tokenize not found (build it first)" >&2; return 1; }
  log=$("$bin/h5tokenize" --tokenizer "$tok" --output "$out" "$input" 2>&1) || {
    echo "tiny_data: h5tokenize --tokenizer $tok --output $out $input failed:" >&2
    echo "$log" | tail -n 20 >&2
    return 1
  }
}

tiny_data() {
  local bin=${1:?usage: tiny_data BIN DIR CHAPTERS} dir=${2:?usage: tiny_data BIN DIR CHAPTERS}
  local n=${3:?usage: tiny_data BIN DIR CHAPTERS} tok
  tiny_chapters "$dir" "$n" || return 1
  tok=$(tiny_tokenizer "$dir") || return 1
  tiny_shard "$bin" "$tok" "$dir/train.jsonl" "$dir/data" || return 1
  echo "$tok"
}
