#!/usr/bin/env bash
# Make `cosign` (the signature tool `verify --require-signature` and the signing tests use) available,
# idempotently. Debian 12 has no cosign package; Debian 13's (2.5, a static Go binary) runs on Debian 12
# (ci/trixie-apart.sh fetches it without touching the system's apt).
# Usage: ci/setup-cosign.sh   (prints the cosign path; COSIGN_DIR, default /usr/local/bin, is where it goes)
set -euo pipefail
log() { printf '▶ %s\n' "$*" >&2; }
dest="${COSIGN_DIR:-/usr/local/bin}"
if command -v cosign >/dev/null 2>&1; then
  command -v cosign
  exit 0
fi
# shellcheck source=ci/trixie-apart.sh
. "$(dirname "$0")/trixie-apart.sh"
trixie_update
tmp=$(mktemp -d)
trixie_unpack "$tmp" cosign
install -m 0755 "$tmp/usr/bin/cosign" "$dest/cosign"
rm -rf "$tmp"
"$dest/cosign" version >/dev/null 2>&1 || { echo "error: $dest/cosign does not run on this machine" >&2; exit 3; }
log "$dest/cosign installed"
echo "$dest/cosign"
