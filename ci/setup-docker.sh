#!/usr/bin/env bash
# Make what builds and tests need available on a fresh Debian/Ubuntu machine, idempotently:
#   a Docker engine (installed and started if none answers), the tools the tests use
#   (debootstrap, Debian's docker-registry, htpasswd), and each base image BASE (name:tag) —
#   pulled by its DIGEST where a registry is reachable, else made locally with debootstrap (Debian bases).
# Usage: ci/setup-docker.sh BASE[@sha256:DIGEST]...   (one argument per base; CI passes every `ci: true` entry's)
# DOCKER_ENGINE picks the engine:
#   auto (default)    an engine that answers already is used as it is (we never stop one; an older one is said to
#                     lack file-time rewriting and zstd layers); when none answers, `modern` is started
#   modern            Docker 26 + buildx + the containerd image store, what Docker's own packages give users:
#                     Debian 13's docker.io, docker-cli and containerd, and Debian 14's docker-buildx, unpacked under
#                     MODERN_DOCKER (default /opt/docker-modern); runc stays the host's (Debian 13's needs
#                     glibc 2.38). The builder then uses `docker buildx build`. Refused while an older engine
#                     answers. Debian's docker.io is installed beside it (not started): its client is the one the
#                     tests call, and its 20.10 dockerd runs the Docker 20.10 job (tests/integration/test_docker20.py)
#   debian            the host's docker.io (Debian 12: 20.10, BuildKit embedded in its client)
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: ci/setup-docker.sh BASE_NAME:TAG[@sha256:DIGEST]..." >&2; exit 2; }
log() { printf '▶ %s\n' "$*" >&2; }

# Debian's docker client (20.10) still embeds BuildKit; a newer client without the buildx plugin refuses.
docker_bin=/usr/bin/docker
engine="${DOCKER_ENGINE:-auto}"
modern="${MODERN_DOCKER:-/opt/docker-modern}"
case "$engine" in
  auto|debian|modern) ;;
  *) echo "error: DOCKER_ENGINE=$engine: use auto (the engine that answers, else Docker 26 + buildx), modern (Docker 26 + buildx) or debian (the host's docker.io)" >&2; exit 2 ;;
esac
is_modern() { [[ "$1" =~ ^(2[6-9]|[3-9][0-9])\. ]]; }
# The version of the engine answering now, through any client here (none: empty).
answering() {
  local c
  for c in "$modern/usr/bin/docker" /usr/bin/docker docker; do
    command -v "$c" >/dev/null 2>&1 && "$c" version --format '{{.Server.Version}}' 2>/dev/null && return 0
  done
  return 0
}
running=""
if [ "$engine" != debian ]; then
  running=$(answering)
  if [ -n "$running" ] && ! is_modern "$running"; then
    if [ "$engine" = modern ]; then
      # Refuse before installing anything: an older engine already holds the socket, and we never stop one.
      echo "error: DOCKER_ENGINE=modern, but Docker $running answers already: stop it, then re-run (nothing was installed)" >&2
      exit 3
    fi
    log "Docker $running answers: builds use it (no file-time rewriting, no zstd layers); stop it and re-run for Docker 26 + buildx"
  fi
  engine=modern  # auto: what answers is used below; when nothing does, the modern engine is started
fi
need=()
if [ -n "$running" ]; then
  # A modern engine runs already (the user's own, or ours from an earlier run): used as it is, nothing installed
  # beside it (our buildx linked into /usr/local would shadow a newer one of theirs).
  docker_bin=$(command -v docker || echo "$modern/usr/bin/docker")
elif [ "$engine" = modern ]; then
  command -v runc >/dev/null || need+=(runc)
  [ -x /usr/bin/docker ] || need+=(docker.io)
  docker_bin="$modern/usr/bin/docker"
else
  command -v dockerd >/dev/null || need+=(docker.io)
fi
command -v debootstrap >/dev/null || need+=(debootstrap)
[ -x /usr/bin/docker-registry ] || need+=(docker-registry)
command -v htpasswd >/dev/null || need+=(apache2-utils)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

dockerd_bin=dockerd
dockerd_argv=(dockerd)
if [ "$engine" = modern ] && [ -z "$running" ]; then
  # `Docker version 26.1.5+dfsg1, build 411e817`, `github.com/docker/buildx 0.29.1+ds1 …`: reinstalled unless ours
  # is there, the engine 26 or newer and buildx 0.14 or newer (the first to write BuildKit's provenance into its
  # metadata file; trixie has 0.13.1, so buildx comes from forky: one static Go binary, libc6 >= 2.34).
  buildx_version=$("$modern/usr/libexec/docker/cli-plugins/docker-buildx" version 2>/dev/null | awk '{print $2}' || true)
  if ! is_modern "$("$modern/usr/sbin/dockerd" --version 2>/dev/null | sed -n 's/^Docker version \([^,]*\),.*/\1/p')" \
     || ! [[ "$buildx_version" =~ ^0\.(1[4-9]|[2-9][0-9])\.|^[1-9] ]]; then
    # shellcheck source=ci/trixie-apart.sh
    . "$(dirname "$0")/trixie-apart.sh"
    trixie_update
    trixie_unpack "$modern" docker.io docker-cli docker-buildx/forky containerd
  fi
  # Any docker client finds buildx here (a plugin directory every client searches).
  mkdir -p /usr/local/lib/docker/cli-plugins
  ln -sfn "$modern/usr/libexec/docker/cli-plugins/docker-buildx" /usr/local/lib/docker/cli-plugins/docker-buildx
  printf '%s\n' '{"features": {"containerd-snapshotter": true}}' > "$modern/daemon.json"
  # Its own containerd, shim and docker-proxy first on PATH; runc is the host's.
  dockerd_bin="$modern/usr/sbin/dockerd"
  dockerd_argv=(env "PATH=$modern/usr/sbin:$modern/usr/bin:$PATH" "$dockerd_bin"
                --config-file "$modern/daemon.json")
fi

if ! "$docker_bin" info >/dev/null 2>&1; then
  log "starting $dockerd_bin (log: /tmp/dockerd.log)"
  # setsid: the engine must outlive this script (make runs each recipe line in its own shell).
  setsid "${dockerd_argv[@]}" >/tmp/dockerd.log 2>&1 < /dev/null &
  for _ in $(seq 1 60); do "$docker_bin" info >/dev/null 2>&1 && break; sleep 1; done
  "$docker_bin" info >/dev/null 2>&1 || { echo "error: dockerd did not start; see /tmp/dockerd.log" >&2; exit 3; }
fi
server=$("$docker_bin" version --format '{{.Server.Version}}')
log "docker engine $server ready ($("$docker_bin" info --format '{{.Driver}}') storage)"

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
