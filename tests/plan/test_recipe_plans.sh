#!/usr/bin/env bash
# Every recipe stage (configs/recipes/*/*.yaml) planned with `easyctx_train STAGE --plan` on
# 2 nodes x 8 A100-80GB and 2 nodes x 8 H200 with 256 GiB of host memory per node
# (scripts/recipe_plans.sh --check): each fits, no node holds more host memory than one copy of
# the model state (16 bytes per parameter), and docs/recipes.md shows these plans. Then the
# check itself must catch what it is for: a stage at ZeRO stage 0 (an optimizer replica per
# rank) and one without activation checkpoints are refused, naming why.
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
echo "PASS: every recipe stage fits 2 x 8 A100-80GB and 2 x 8 H200 (256 GiB host per node) with at most one copy of the model state per node; broken stages are refused"
