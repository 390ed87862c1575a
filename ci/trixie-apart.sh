# Sourced by ci/setup-*.sh: fetch Debian 13 (trixie) packages, and single named packages from Debian 14 (forky), on
# any Debian/Ubuntu host without touching the system's apt. The source list has its own sources file and package
# lists under $TRIXIE_STATE, so the system's apt never sees them and nothing else is upgraded. Packages are unpacked (dpkg-deb -x), not
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
Suites: trixie forky
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  log "apt-get update (trixie and forky sources kept apart from the system's)"
  apt-get "${trixie_apt[@]}" update -qq
}

# trixie_unpack DEST PKG[/SUITE]...: download each package's version in SUITE (default trixie) and unpack it
# under DEST; logs versions. A suite is named per package: forky is there only for what trixie's is too old for.
trixie_unpack() {
  local dest="$1" spec pkg suite version deb; shift
  mkdir -p "$dest"
  for spec in "$@"; do
    pkg="${spec%%/*}"; suite=trixie; [ "$spec" = "$pkg" ] || suite="${spec#*/}"
    # madison: `pkg | version | URI suite/main amd64 Packages`, one line per suite that has it
    version=$(apt-cache "${trixie_apt[@]}" madison "$pkg" | awk -F' [|] ' -v s=" $suite/main " 'index($3, s) {print $2; exit}')
    [ -n "$version" ] \
      || { echo "error: no $pkg package in $suite (apt-cache madison $pkg found none there)" >&2; exit 3; }
    ( cd "$TRIXIE_STATE/archives" && apt-get "${trixie_apt[@]}" download "$pkg=$version" >/dev/null )
    deb="$TRIXIE_STATE/archives/${pkg}_${version//:/%3a}_$(dpkg --print-architecture).deb"
    [ -f "$deb" ] || deb=$(ls -t "$TRIXIE_STATE/archives/${pkg}_"*.deb | head -1)
    dpkg-deb -x "$deb" "$dest"
    log "$pkg $version from $suite"
  done
}
