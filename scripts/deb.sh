#!/usr/bin/env bash
# Build the Debian packages (debian/) in a clean copy of the source tree and check them with lintian.
#
#   scripts/deb.sh OUTDIR        (make deb: OUTDIR is build-deb)
#
# The copy holds the files git knows of (tracked, and untracked ones not ignored: no build directory,
# no node_modules), as they are in the work tree, in OUTDIR/agenthost-VERSION; dpkg-buildpackage -b
# writes the .deb files and the .changes beside it, in OUTDIR. lintian then checks them and fails on any
# error or warning that debian/*.lintian-overrides does not explain. Prints the .deb files last.
set -euo pipefail
out=${1:?usage: deb.sh OUTDIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=$(dpkg-parsechangelog -l "$root/debian/changelog" -S Version)
src="$out/agenthost-$version"

rm -rf "$out"
mkdir -p "$src"
out=$(cd "$out" && pwd)
src="$out/agenthost-$version"
(cd "$root" && git ls-files -z --cached --others --exclude-standard) |
  (cd "$root" && while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done) |
  (cd "$root" && tar --null -T - -cf -) | tar -C "$src" -xf -

(cd "$src" && dpkg-buildpackage -b -us -uc)

changes=$(ls "$out"/agenthost_"$version"_*.changes)
lintian --fail-on error,warning --info "$changes"
echo "lintian: no error or warning in $(basename "$changes")"
ls -1 "$out"/*.deb
