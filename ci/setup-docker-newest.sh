#!/usr/bin/env bash
# The newest Docker Debian ships (Debian 14's docker.io and containerd), unpacked under NEWEST_DOCKER (default
# /opt/docker-newest) for the newest-engine job (tests/integration/test_docker_newest.py, `make test-docker-newest`):
# the engine GitHub's hosted runners and most users have (Docker 28 in 2026), beside `make docker`'s Docker 26,
# which stays the floor the whole suite runs on. Not started here: the job starts a private engine from it.
# Idempotent: nothing is fetched when a Docker 27.3 or newer is already there (BuildKit 0.16, the first without
# the secret-mount root-filesystem hash: docs/benchmarks.md). runc stays the host's.
set -euo pipefail
log() { printf '▶ %s\n' "$*" >&2; }
newest="${NEWEST_DOCKER:-/opt/docker-newest}"
version=$("$newest/usr/sbin/dockerd" --version 2>/dev/null | sed -n 's/^Docker version \([^,+]*\).*/\1/p' || true)
if [ -n "$version" ] && dpkg --compare-versions "$version" ge 27.3; then
  log "Docker $version under $newest"
  exit 0
fi
# shellcheck source=ci/trixie-apart.sh
. "$(dirname "$0")/trixie-apart.sh"
trixie_update
rm -rf "$newest"
trixie_unpack "$newest" docker.io/forky containerd/forky
"$newest/usr/sbin/dockerd" --version >&2
