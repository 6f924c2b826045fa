#!/usr/bin/env bash
# What a device call (the GPU machine's `run`) carries for weights/recipe.py, measured before the call.
#
# A call sends the checkout's tracked files, its untracked files that git does not ignore, shared/ and the ignored
# paths named in `carry`, 64 MiB in all. The shipped model files (specdec_np/weights/tiny-*, 44.8 MiB of the 49.1 MiB
# tracked) and the corpus (weights/work/corpus, 28.9 MiB) do not fit together, and the recipe reads no shipped model
# file. So for the one call the model files leave git's index (they stay on disk) and are ignored through
# .git/info/exclude; afterwards `restore` puts them back. Commit nothing between the two.
#
#   weights/gpu_carry.sh check     # the bytes a call would carry now, with the corpus; status 1 if over 64 MiB
#   weights/gpu_carry.sh slim      # untrack and ignore the shipped model files, then check
#   weights/gpu_carry.sh restore   # the index and .git/info/exclude as they were
#
# Then the call: command `PYTHONUNBUFFERED=1 python3 weights/recipe.py --device cuda --out "$OUT"`,
# carry ["weights/work/corpus"], timeout_s 600 (recipe.py's docstring says why its budget is 9.5 minutes).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
SHIPPED=(specdec_np/weights/tiny-target specdec_np/weights/tiny-draft specdec_np/weights/tiny-eagle
         specdec_np/weights/tiny-trigram.npz)
CARRY=weights/work/corpus
MARK="# weights/gpu_carry.sh slim (until restore)"
EXCLUDE="$(git rev-parse --git-path info/exclude)"

bytes_of() { # the total size of the NUL-separated paths on stdin that exist as files
  { xargs -0 -r stat -c %s -- 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}'
}

check() {
  [ -d "$CARRY" ] || { echo "gpu_carry.sh: $CARRY missing: run python weights/build_corpus.py first" >&2; exit 2; }
  local tracked untracked shared carried total
  tracked=$(git ls-files -z --cached | bytes_of)
  untracked=$(git ls-files -z --others --exclude-standard | bytes_of)
  shared=$(if [ -d shared ]; then find shared -type f -print0; fi | bytes_of)
  carried=$(find "$CARRY" -type f -print0 | bytes_of)
  total=$((tracked + untracked + shared + carried))
  awk -v a="$tracked" -v b="$untracked" -v c="$shared" -v d="$carried" -v t="$total" -v p="$CARRY" 'BEGIN {
    m = 1048576
    printf "tracked %.1f MiB + untracked, not ignored %.1f MiB + shared/ %.1f MiB + carried %s %.1f MiB = %.1f MiB" \
           " (a call carries at most 64 MiB)\n", a / m, b / m, c / m, p, d / m, t / m }'
  if [ "$total" -gt $((64 << 20)) ]; then
    echo "gpu_carry.sh: over 64 MiB: run 'weights/gpu_carry.sh slim' first" >&2
    exit 1
  fi
}

case "${1:-}" in
  check) check ;;
  slim)
    grep -qxF "$MARK" "$EXCLUDE" 2>/dev/null || { echo "$MARK"; printf '/%s\n' "${SHIPPED[@]}"; } >>"$EXCLUDE"
    git rm -r -q --cached --ignore-unmatch -- "${SHIPPED[@]}"
    check
    echo "call: command 'PYTHONUNBUFFERED=1 python3 weights/recipe.py --device cuda --out \"\$OUT\"'," \
         "carry [\"$CARRY\"], timeout_s 600; then: weights/gpu_carry.sh restore" ;;
  restore)
    git reset -q -- "${SHIPPED[@]}"
    if [ -f "$EXCLUDE" ]; then
      awk -v mark="$MARK" '$0 == mark {skip = 1; next}
                           skip && /^\/specdec_np\/weights\/tiny-/ {next}
                           {skip = 0; print}' "$EXCLUDE" >"$EXCLUDE.tmp" && mv "$EXCLUDE.tmp" "$EXCLUDE"
    fi
    git status --short -- "${SHIPPED[@]}" ;;
  *) echo "usage: weights/gpu_carry.sh check|slim|restore" >&2; exit 2 ;;
esac
