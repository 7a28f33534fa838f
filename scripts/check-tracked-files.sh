#!/usr/bin/env bash
# Fails when git tracks a build output: an executable binary (ELF, Mach-O,
# PE, a shared library or an archive), or any file over 1 MiB. A data file
# the project really needs goes into scripts/tracked-files.allow (one path per
# line, with a comment saying why) instead of slipping through.
# Usage: scripts/check-tracked-files.sh [REPO_DIR]
set -euo pipefail
cd "${1:-$(git rev-parse --show-toplevel)}"

limit=$((1024 * 1024))
allow_file=scripts/tracked-files.allow
declare -A allowed=()
if [ -f "$allow_file" ]; then
  while IFS= read -r line; do
    line=${line%%#*}; line=${line%"${line##*[![:space:]]}"}
    [ -n "$line" ] && allowed[$line]=1
  done <"$allow_file"
fi

bad=0
while IFS= read -r -d '' path; do
  [ -f "$path" ] || continue # deleted in the work tree, or a submodule
  [ -n "${allowed[$path]:-}" ] && continue
  size=$(stat -c %s "$path")
  if [ "$size" -gt "$limit" ]; then
    echo "tracked file over 1 MiB: $path ($size bytes); remove it, or allow it in $allow_file with a reason" >&2
    bad=1
  fi
  # The first bytes tell an executable or a library whatever its name.
  magic=$(head -c 4 "$path" | od -An -tx1 | tr -d ' \n')
  case "$magic" in
    7f454c46 | cffaedfe | cefaedfe | feedfacf | feedface | cafebabe | 213c6172*)
      echo "tracked executable or library: $path (magic $magic); build outputs never go into git" >&2
      bad=1 ;;
    4d5a*)
      echo "tracked Windows executable: $path; build outputs never go into git" >&2
      bad=1 ;;
  esac
done < <(git ls-files -z)
exit $bad
