#!/usr/bin/env bash
# The model families end to end on the CPU: for qwen2 (q/k/v biases), qwen3 (q/k norms) and a
# YaRN-scaled Llama of the demo's shape, easyctx_train trains a few steps from random weights
# and exports the model (f32), the export names the family (config.json: Qwen2ForCausalLM,
# Qwen3ForCausalLM, rope_scaling yarn) and holds its tensors (q_proj.bias, q_norm.weight), the
# export reloads as model.init hf: for a step with the same first loss, and easyctx_eval_ppl
# and easyctx_eval_needle run on it (the same perplexities from the export and from the
# checkpoint, finite, within (1, vocab)).
set -uo pipefail
src=$1
bin=$2
work=$(mktemp -d /tmp/easyctx-eval-families.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; tail -20 "$work"/*.log 2>/dev/null | cut -c1-300; trap - EXIT; exit 1; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

source "$src/tests/tiny_data.sh"
tok=$(tiny_data "$bin" "$work" 40) || fail "the training data (tests/tiny_data.sh)"
sed -n '1000,1020p' "$work/chapters.jsonl" > "$work/eval.jsonl"
tiny_shard "$bin" "$tok" "$work/eval.jsonl" "$work/evaldata" || fail "h5tokenize eval"
demo=$(grep -v '^#' "$src/configs/models/demo.yaml" | grep -v '^model_type' | grep -v '^ *$')
# first_loss LOG: the loss of step 1 in an easyctx_train log.
first_loss() { sed -nE 's/.*step 1\/[0-9]+.* loss ([0-9.]+).*/\1/p' "$1" | head -n 1; }

for fam in qwen2 qwen3 yarn; do
  case $fam in
    yarn) extra=$'rope_scaling:\n  rope_type: yarn\n  factor: 4.0\n  original_max_position_embeddings: 256' ;;
    *) extra="model_type: $fam" ;;
  esac
  printf '%s\n%s\n' "$demo" "$extra" > "$work/$fam.yaml"
  { tiny_stage "$work/data" 96 4
    cat <<YAML
  batch_size: 2
  lr: 3e-3
  device: cpu
output:
  dir: $work/$fam
  hf_dtype: f32
YAML
  } | sed "s#config: demo#config: $work/$fam.yaml#" > "$work/$fam-stage.yaml"
  "$bin/easyctx_train" "$work/$fam-stage.yaml" > "$work/$fam-train.log" 2>&1 || fail "$fam: training"
  cfg=$work/$fam/final/config.json
  [ -f "$cfg" ] || fail "$fam: no HF export"
  case $fam in
    qwen2) want='"Qwen2ForCausalLM"'; tensor=model.layers.0.self_attn.q_proj.bias ;;
    qwen3) want='"Qwen3ForCausalLM"'; tensor=model.layers.0.self_attn.q_norm.weight ;;
    yarn) want='"yarn"'; tensor=model.layers.0.self_attn.q_proj.weight ;;
  esac
  grep -q "$want" "$cfg" || fail "$fam: the export's config.json lacks $want: $(cat "$cfg")"
  grep -aq "$tensor" "$work/$fam/final/model.safetensors" || fail "$fam: the export lacks $tensor"
  # The export as model.init hf: (its own config.json): the same model, so the same first loss
  # as a run of the same data order from the exported weights through ckpt:.
  for init in "hf:$work/$fam/final" "ckpt:$work/$fam"; do
    tag=${init%%:*}
    sed -e "s#config: $work/$fam.yaml#config: $work/$fam.yaml\n  init: $init#" -e "s#dir: $work/$fam\$#dir: $work/$fam-$tag#" \
      -e "s#steps: 4#steps: 1#" "$work/$fam-stage.yaml" > "$work/$fam-$tag.yaml"
    "$bin/easyctx_train" "$work/$fam-$tag.yaml" > "$work/$fam-$tag.log" 2>&1 || fail "$fam: training from $init"
  done
  a=$(first_loss "$work/$fam-hf.log") b=$(first_loss "$work/$fam-ckpt.log")
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "$fam: first loss from the export ($a) and from the checkpoint ($b) differ"
  common=(--tokenized "$work/evaldata" --min-tokens 64 --max-tokens 128 --tokens-step 64 --samples 2 --device cpu)
  "$bin/easyctx_eval_ppl" --model "$work/$fam/final" --model "ckpt:$work/$fam" "${common[@]}" \
    --output-file "$work/$fam-ppl.csv" > "$work/$fam-ppl.log" 2>&1 || fail "$fam: easyctx_eval_ppl"
  final=$work/$fam-ppl.final.csv ckpt=$(ls "$work"/$fam-ppl.step-*.csv 2>/dev/null | head -n 1)
  [ -f "$final" ] && [ -n "$ckpt" ] && cmp -s "$final" "$ckpt" || fail "$fam: perplexity of the export and the checkpoint differ"
  awk -F, 'NR > 1 && !($2 > 1 && $2 < 2000) { bad = 1 } END { exit bad }' "$final" || fail "$fam: ppl $(cat "$final")"
  "$bin/easyctx_eval_needle" --model "$work/$fam/final" --device cpu --tokenizer "$tok" --min-context-length 100 \
    --max-context-length 200 --context-interval 100 --depth-interval 0.5 --samples 1 --digits 5 --task needle,passkey \
    --progress-every 0 --output-dir "$work/$fam-needle" > "$work/$fam-needle.log" 2>&1 || fail "$fam: easyctx_eval_needle"
  [ "$(tail -n +2 "$work/$fam-needle/needle.csv" | wc -l)" -eq 6 ] || fail "$fam: needle.csv: 2 lengths x 3 depths"
  echo "$fam: exported $want, first loss $a from the export and the checkpoint, ppl $(tail -n 1 "$final")"
done
echo "PASS"
