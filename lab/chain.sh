#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
# Several lab parts in one GPU call, in order, each bounded by what is left of the call:
#
#   OUT=<dir> [CALL_S=585] bash lab/chain.sh 'PART=build lab/attn.sh' 'PART=profile TABLE=t.json lab/attn.sh'
#
# Each step is `VAR=value ... script`: it runs as `env VAR=value ... OUT=$OUT/<i>-<script>-<PART> DEADLINE=<s left>
# bash script`. Its folder is packed into one $OUT/<i>-<script>-<PART>.tar.gz (the transfer brings at most 8
# files back) and every Markdown file it wrote is printed to stdout. A failed step stops the chain (later
# steps use earlier ones' builds) unless KEEP_GOING=1; the chain's exit status is the first failure's.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT}"
[ $# -gt 0 ] || { echo "chain.sh: no steps" >&2; exit 2; }
END=$(( $(date +%s) + ${CALL_S:-585} ))
rc=0 i=0
for step in "$@"; do
    i=$((i + 1))
    read -r -a words <<<"$step"
    script=${words[${#words[@]}-1]}
    vars=("${words[@]:0:${#words[@]}-1}")
    [ -f "$script" ] || { echo "chain.sh: step $i: no script $script" >&2; [ "$rc" -eq 0 ] && rc=2; break; }
    part=$(printf '%s\n' "${vars[@]}" | sed -n 's/^PART=//p' | head -1)
    name=$i-$(basename "$script" .sh)${part:+-$part}
    left=$(( END - $(date +%s) ))
    if [ "$left" -lt 30 ]; then
        echo "chain.sh: step $i ($step) not started: ${left} s left" >&2
        [ "$rc" -eq 0 ] && rc=124
        break
    fi
    mkdir -p "$OUT/$name"
    t0=$(date +%s)
    echo "chain.sh [$(date +%T)]: step $i: $step (${left} s left)" >&2
    env "${vars[@]}" OUT="$OUT/$name" DEADLINE="$left" bash "$script" >"$OUT/$name/console.log" 2>&1
    s=$?
    echo "chain.sh: step $i rc=$s in $(( $(date +%s) - t0 )) s: $step" | tee -a "$OUT/steps.txt" >&2
    tail -3 "$OUT/$name/console.log" >&2
    for md in "$OUT/$name"/*.md; do
        [ -f "$md" ] && { echo "## $name/$(basename "$md")"; cat "$md"; echo; }
    done
    tar -czf "$OUT/$name.tar.gz" -C "$OUT" "$name" && rm -rf "${OUT:?}/$name"
    if [ "$s" -ne 0 ]; then
        [ "$rc" -eq 0 ] && rc=$s
        [ -n "${KEEP_GOING:-}" ] || break
    fi
done
exit "$rc"
