#!/usr/bin/env bash
# Every recipe stage (configs/recipes/*/*.yaml) planned with `easyctx_train STAGE --plan` on the
# world its folder is sized for (recipe.conf: 2 nodes x 8 for llama2-7b-1m and llama3-8b-1m,
# 1 node x 8 for llama2-7b-1m-8gpu and llama3-8b-1m-lora-8gpu, 1 GPU for llama3-8b-lora-1gpu)
# of A100-80GB and of H200 with 256 GiB of host memory per
# node (scripts/recipe_plans.sh --check): each fits, no node holds more host memory between
# steps than one copy of the model state (16 bytes per parameter), and docs/recipes.md shows
# these plans. Then the check itself must catch what it is for: a stage at ZeRO stage 0 (an
# optimizer replica per rank) and one without activation checkpoints are refused, naming why;
# a folder's recipe.conf is the world planned (an 8-way sequence-parallel stage in a folder
# sized for 1 x 4 is refused), and a folder without one is refused.
set -uo pipefail
src=$1
bin=$2
work=$(mktemp -d /tmp/easyctx-recipe-plans.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

BIN=$bin bash "$src/scripts/recipe_plans.sh" --check
rc=$?
[ $rc -eq 0 ] || fail "scripts/recipe_plans.sh --check exited $rc (the PROBLEM lines above say why)"

mkdir -p "$work/recipes/broken"
cp "$src/configs/recipes/llama2-7b-1m/recipe.conf" "$work/recipes/broken/"
stage=$src/configs/recipes/llama2-7b-1m/s3-256k.yaml
sed 's/^    stage: 3 .*/    stage: 0/' "$stage" > "$work/recipes/broken/zero0.yaml"
sed 's/^  checkpoint: .*/  checkpoint: none/' "$stage" > "$work/recipes/broken/nockpt.yaml"
grep -q '^    stage: 0' "$work/recipes/broken/zero0.yaml" || fail "could not make the stage-0 variant of $stage"
grep -q '^  checkpoint: none' "$work/recipes/broken/nockpt.yaml" || fail "could not make the no-checkpoint variant"
BIN=$bin RECIPES=$work/recipes bash "$src/scripts/recipe_plans.sh" --check > "$work/out" 2> "$work/err"
rc=$?
[ $rc -eq 1 ] || fail "the check passed broken stages (exit $rc)"
grep -q "zero0.yaml on A100-80GB: host per node .* is more than one copy of the model state" "$work/err" ||
  { cat "$work/err"; fail "a stage-0 stage was not refused for its host memory"; }
grep -q "nockpt.yaml on 2 x 8 A100-80GB: does not fit: predicted .* per GPU" "$work/err" ||
  { cat "$work/err"; fail "a stage without checkpoints was not refused for its GPU memory"; }

# recipe.conf is the world the stages are planned on: s3 of the 8-GPU recipe (8-way sequence
# parallel) in a folder that says 1 x 4 GPUs cannot be laid out.
mkdir -p "$work/small/four"
cp "$src/configs/recipes/llama2-7b-1m-8gpu/s3-256k.yaml" "$work/small/four/"
printf 'nodes: 1\ngpus_per_node: 4\n' > "$work/small/four/recipe.conf"
BIN=$bin RECIPES=$work/small bash "$src/scripts/recipe_plans.sh" --check > "$work/out" 2> "$work/err"
rc=$?
[ $rc -eq 1 ] && grep -q "s3-256k.yaml on A100-80GB: easyctx_train --plan exited 2: .*target world 1 node(s) x 4 = 4 rank(s)" "$work/err" ||
  { cat "$work/err"; fail "a stage planned on its folder's recipe.conf (1 x 4) was not refused (exit $rc)"; }
grep -q "sized for 1 node(s) x 4 GPUs" "$work/out" || fail "the table does not say the folder's world (1 x 4)"
rm "$work/small/four/recipe.conf"
BIN=$bin RECIPES=$work/small bash "$src/scripts/recipe_plans.sh" --check > "$work/out" 2> "$work/err"
rc=$?
[ $rc -eq 2 ] && grep -q "four/recipe.conf not found" "$work/err" ||
  { cat "$work/err"; fail "a recipe folder without recipe.conf was not refused (exit $rc)"; }
echo "PASS: every recipe stage fits its folder's world (2 x 8, 1 x 8 or 1 x 1) of A100-80GB and of H200 (256 GiB host per node) with at most one copy of the model state per node between steps; broken stages and a missing recipe.conf are refused"
