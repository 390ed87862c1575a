#!/usr/bin/env bash
# Make `cosign` (the signature tool `verify --require-signature` and the signing tests use) available,
# idempotently. Debian 12 has no cosign package; Debian 13's (2.5, a static Go binary) runs on Debian 12.
# It is fetched with apt from a trixie source list kept apart from the system's (own sources file, own
# package lists), so the system's apt never sees trixie and nothing else is upgraded.
# Usage: ci/setup-cosign.sh   (prints the cosign path; COSIGN_DIR, default /usr/local/bin, is where it goes)
set -euo pipefail
log() { printf '▶ %s\n' "$*" >&2; }
dest="${COSIGN_DIR:-/usr/local/bin}"
if command -v cosign >/dev/null 2>&1; then
  command -v cosign
  exit 0
fi
state=/var/lib/apt/trixie-apart
mkdir -p "$state/lists/partial" "$state/archives/partial"
cat > "$state/trixie.sources" <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
apt_apart=(-o "Dir::Etc::SourceList=$state/trixie.sources" -o "Dir::Etc::SourceParts=/dev/null"
           -o "Dir::State::Lists=$state/lists" -o "Dir::Cache::Archives=$state/archives"
           -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache=" -o "APT::Sandbox::User=root")
log "apt-get update (a trixie source kept apart from the system's)"
apt-get "${apt_apart[@]}" update -qq
candidate=$(apt-cache "${apt_apart[@]}" policy cosign | sed -n 's/^ *Candidate: *//p')
[ -n "$candidate" ] && [ "$candidate" != "(none)" ] \
  || { echo "error: no cosign package in the trixie source (apt-cache policy cosign: ${candidate:-nothing})" >&2; exit 3; }
log "cosign $candidate from trixie"
( cd "$state/archives" && apt-get "${apt_apart[@]}" download cosign >/dev/null )
deb=$(ls -t "$state"/archives/cosign_*.deb | head -1)
tmp=$(mktemp -d)
dpkg-deb -x "$deb" "$tmp"
install -m 0755 "$tmp/usr/bin/cosign" "$dest/cosign"
rm -rf "$tmp"
"$dest/cosign" version >/dev/null 2>&1 || { echo "error: $dest/cosign does not run on this machine" >&2; exit 3; }
log "$dest/cosign installed from $(basename "$deb")"
echo "$dest/cosign"
