#!/usr/bin/env bash
# Formats the C++ sources with clang-format and the repository's .clang-format; --check changes
# nothing, lists the files that would change and exits 1 if there are any.
# Usage: scripts/format.sh [--check] [file...]   (no files: every tracked .cc/.h of the folders below)
# CLANG_FORMAT picks the binary (default clang-format). The tree is formatted with Debian's
# clang-format 14; other major versions break some lines differently.
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
cf="${CLANG_FORMAT:-clang-format}"
if ! command -v "$cf" >/dev/null; then
  echo "format.sh: $cf not found (apt-get install -y clang-format)" >&2
  exit 2
fi
major=$("$cf" --version | sed -n 's/.*clang-format version \([0-9]*\).*/\1/p')
if [ "$major" != 14 ]; then echo "format.sh: warning: $cf is version $major, the tree is formatted with 14" >&2; fi
if [ $# -gt 0 ]; then
  files=("$@")
else
  # third_party/ is not ours and is not tracked; nothing under these folders is generated.
  mapfile -t files < <(git ls-files -- \
    {kernels,base,metrics,datasets,reports,eval,tests,bench}/'*.cc' \
    {kernels,base,metrics,datasets,reports,eval,tests,bench}/'*.h')
fi
if [ $check -eq 0 ]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$cf" -i --style=file
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! "$cf" --style=file "$f" | cmp -s - "$f"; then echo "$f"; bad=1; fi
done
if [ $bad -ne 0 ]; then echo "format.sh: the files above need formatting (scripts/format.sh)" >&2; fi
exit $bad
