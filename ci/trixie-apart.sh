# Sourced by ci/setup-*.sh: fetch Debian 13 (trixie) packages on any Debian/Ubuntu host without touching the
# system's apt. The trixie source list has its own sources file and package lists under $TRIXIE_STATE, so the
# system's apt never sees trixie and nothing else is upgraded. Packages are unpacked (dpkg-deb -x), not
# installed: they are static Go binaries that run on Debian 12 too (seen: cosign, docker.io, buildx, containerd).
# DEBIAN_MIRROR overrides the archive (default http://deb.debian.org/debian).
TRIXIE_STATE=/var/lib/apt/trixie-apart
trixie_apt=(-o "Dir::Etc::SourceList=$TRIXIE_STATE/trixie.sources" -o "Dir::Etc::SourceParts=/dev/null"
            -o "Dir::State::Lists=$TRIXIE_STATE/lists" -o "Dir::Cache::Archives=$TRIXIE_STATE/archives"
            -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache=" -o "APT::Sandbox::User=root")

trixie_update() {
  mkdir -p "$TRIXIE_STATE/lists/partial" "$TRIXIE_STATE/archives/partial"
  cat > "$TRIXIE_STATE/trixie.sources" <<SRC
Types: deb
URIs: ${DEBIAN_MIRROR:-http://deb.debian.org/debian}
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  log "apt-get update (a trixie source kept apart from the system's)"
  apt-get "${trixie_apt[@]}" update -qq
}

# trixie_unpack DEST PKG...: download each package's trixie candidate and unpack it under DEST; logs versions.
trixie_unpack() {
  local dest="$1" pkg candidate deb; shift
  mkdir -p "$dest"
  for pkg in "$@"; do
    candidate=$(apt-cache "${trixie_apt[@]}" policy "$pkg" | sed -n 's/^ *Candidate: *//p')
    [ -n "$candidate" ] && [ "$candidate" != "(none)" ] \
      || { echo "error: no $pkg package in the trixie source (apt-cache policy $pkg: ${candidate:-nothing})" >&2; exit 3; }
    ( cd "$TRIXIE_STATE/archives" && apt-get "${trixie_apt[@]}" download "$pkg=$candidate" >/dev/null )
    deb=$(ls -t "$TRIXIE_STATE/archives/${pkg}_"*.deb | head -1)
    dpkg-deb -x "$deb" "$dest"
    log "$pkg $candidate from trixie"
  done
}
