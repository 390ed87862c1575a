#!/usr/bin/env bash
# Make what builds and tests need available on a fresh Debian/Ubuntu machine, idempotently:
#   a Docker engine (installed and started if none answers), the tools the tests use
#   (debootstrap, Debian's docker-registry, htpasswd), and each base image BASE (name:tag) —
#   pulled by its DIGEST where a registry is reachable, else made locally with debootstrap (Debian bases).
# Usage: ci/setup-docker.sh BASE[@sha256:DIGEST]...   (one argument per base; CI passes every `ci: true` entry's)
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: ci/setup-docker.sh BASE_NAME:TAG[@sha256:DIGEST]..." >&2; exit 2; }
log() { printf '▶ %s\n' "$*" >&2; }

# Debian's docker client (20.10) still embeds BuildKit; a newer client without the buildx plugin refuses.
docker_bin=/usr/bin/docker
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
[ -x /usr/bin/docker-registry ] || need+=(docker-registry)
command -v htpasswd >/dev/null || need+=(apache2-utils)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! "$docker_bin" info >/dev/null 2>&1; then
  log "starting dockerd (log: /tmp/dockerd.log)"
  # setsid: the engine must outlive this script (make runs each recipe line in its own shell).
  setsid dockerd >/tmp/dockerd.log 2>&1 < /dev/null &
  for _ in $(seq 1 60); do "$docker_bin" info >/dev/null 2>&1 && break; sleep 1; done
  "$docker_bin" info >/dev/null 2>&1 || { echo "error: dockerd did not start; see /tmp/dockerd.log" >&2; exit 3; }
fi
log "docker engine $("$docker_bin" version --format '{{.Server.Version}}') ready"

provide_base() {  # $1 = name:tag, $2 = sha256:digest or empty
  local base="$1" digest="$2" root suite
  if "$docker_bin" image inspect "$base" >/dev/null 2>&1; then
    log "base image $base present"
    return 0
  fi
  if [ -n "$digest" ] && timeout 300 "$docker_bin" pull -q "${base}@${digest}" >/dev/null 2>&1; then
    "$docker_bin" tag "${base}@${digest}" "$base"
    log "base image $base pulled by digest $digest"
    return 0
  fi
  case "$base" in
    debian:bookworm*|debian:trixie*)
      suite="${base#debian:}"; suite="${suite%%-*}"
      # No registry reachable: build the same distribution from Debian's archive (see docs/ci.md).
      root=$(mktemp -d)
      log "no registry: debootstrap $suite into $root and import it as $base"
      debootstrap --variant=minbase "$suite" "$root" >/tmp/debootstrap.log 2>&1 \
        || { echo "error: debootstrap failed; see /tmp/debootstrap.log" >&2; exit 3; }
      tar -C "$root" -c . | "$docker_bin" import - "$base" >/dev/null
      rm -rf "$root"
      log "base image $base made locally (not the pinned digest: builds record it as substituted)"
      ;;
    *)
      echo "error: base image $base cannot be pulled and cannot be made locally; pull it from a mirror and tag it $base" >&2
      exit 3
      ;;
  esac
}

for ref in "$@"; do
  case "$ref" in
    *@sha256:*) provide_base "${ref%@*}" "${ref#*@}" ;;
    *) provide_base "$ref" "" ;;
  esac
done
