#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
#
# MUL_MAT_ID through the normal pipeline on the lent H200, in two calls of lab/moe.sh's parts (its tree
# build/at/llama.cpp and build dir build/at/build-sys are reused when present; every part is resumable on
# a warm machine and packs what it has into $OUT). Needs .carry/llama.cpp.tar.xz and
# .carry/smollm2.meta.gguf. DEADLINE (default 540) bounds the whole call; each part gets what is left.
#
#   PART=1   model (qwen3moe-a3b-L$LAYERS, Q4_K_M) + trace (llama-bench pp2048 at ubatch 128 and 512, tg128,
#            with the route trace) -> census with MUL_MAT_ID rows per routing bucket
#   PART=2   tune (`tune run` on the census' MUL_MAT_ID rows: uniform / skewed / few per point, every
#            MUL_MAT_ID configuration) + table (`codegen`: routing-0 rules where a configuration is
#            harmless in every bucket and passes in one; the per-bucket winners printed)
#   PART=3   ab (stock vs the table, pp2048 at ubatch 128 and 512 and tg128, interleaved pairs); with
#            TABLE=tables/cuda-sm90-nvidia-h200-moe/table.json right after PART=1 (no sweep)
#
# Fails loudly: the first part that fails stops the call with its exit status; nothing is filled in.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT}" "${PART:?set PART=1|2|3}"
DEADLINE=${DEADLINE:-540}
START=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - START))); }
case $PART in
1) parts="model trace" ;;
2) parts="tune table" ;;
3) parts="ab" ;;
*)
    echo "unknown PART $PART (1: model + trace, 2: tune + table, 3: ab)" >&2
    exit 2
    ;;
esac
for p in $parts; do
    t=$(left)
    [ "$t" -gt 20 ] || { echo "moe-calls.sh: no time left for part $p (DEADLINE $DEADLINE s): call again" >&2; exit 1; }
    echo "== part $p ($t s left)"
    OUT=$OUT PART=$p DEADLINE=$t bash lab/moe.sh
    rc=$?
    [ "$rc" -eq 0 ] || { echo "moe-calls.sh: part $p failed (rc $rc)" >&2; exit "$rc"; }
done
echo "parts $parts done in $(($(date +%s) - START)) s"
