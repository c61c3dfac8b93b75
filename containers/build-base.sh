#!/usr/bin/env bash
# Build the minimal base image the runtime images sit on, without any image registry:
# debootstrap a Debian root file system (variant minbase, python3 included) from the
# Debian mirror apt is already configured with, and `docker import` it.
#
# The tag is derived from a hash of the inputs (this script, suite, variant, packages,
# architecture), so an unchanged recipe never rebuilds: when the image exists, nothing
# is done. The tag is printed as the LAST line of output.
#
# Environment:
#   CUMATRIX_BASE_SUITE      Debian suite (default: bookworm)
#   CUMATRIX_DEBIAN_MIRROR   mirror URL (default: the first Debian URI in /etc/apt/sources.list*)
#   CUMATRIX_BASE_REPO       image repository name (default: cumatrix-base)
#   DOCKER                   docker client to call (default: docker)
set -euo pipefail

suite="${CUMATRIX_BASE_SUITE:-bookworm}"
variant="minbase"
include="python3"
repo="${CUMATRIX_BASE_REPO:-cumatrix-base}"
docker="${DOCKER:-docker}"
arch="$(dpkg --print-architecture 2>/dev/null || uname -m)"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

die() { echo "build-base.sh: $*" >&2; exit 2; }

command -v "$docker" >/dev/null || die "no docker client on PATH (install docker.io)"
"$docker" version --format '{{.Server.Version}}' >/dev/null 2>&1 \
    || die "no Docker daemon answers; start one with 'sudo dockerd &' or 'sudo systemctl start docker'"

# The mirror is not part of the hash: any mirror of the same suite gives the same packages.
hash="$( { sha256sum "$here/build-base.sh" | cut -d' ' -f1; echo "$suite $variant $include $arch"; } \
        | sha256sum | cut -c1-16)"
tag="$repo:$suite-$hash"

if "$docker" image inspect "$tag" >/dev/null 2>&1; then
    echo "build-base.sh: $tag exists; nothing to do" >&2
    echo "$tag"
    exit 0
fi

command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
[ "$(id -u)" = 0 ] || die "debootstrap needs root; run this script with sudo"

mirror_from_apt() {
    # deb822 files (URIs: ...) and one-line sources (deb URL suite ...); first Debian main archive.
    local f
    for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$f" ] || continue
        awk '
            /^[[:space:]]*URIs:/ { for (i = 2; i <= NF; i++) if ($i ~ /debian\/?$/ && $i !~ /security/) { print $i; exit } }
            /^[[:space:]]*deb[[:space:]]/ {
                for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { if ($i ~ /debian\/?$/ && $i !~ /security/) { print $i; exit } else break }
            }' "$f"
    done | head -n1
}
mirror="${CUMATRIX_DEBIAN_MIRROR:-$(mirror_from_apt)}"
[ -n "$mirror" ] || die "no Debian mirror found in /etc/apt/sources.list*; set CUMATRIX_DEBIAN_MIRROR"

work="$(mktemp -d "${TMPDIR:-/tmp}/cumatrix-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT
root="$work/root"

echo "build-base.sh: debootstrap $suite ($variant, +$include) from $mirror" >&2
if ! debootstrap --variant="$variant" --include="$include" --arch="$arch" \
        "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1; then
    tail -n 20 "$work/debootstrap.log" >&2
    [ -f "$root/debootstrap/debootstrap.log" ] && tail -n 20 "$root/debootstrap/debootstrap.log" >&2
    die "debootstrap failed (log above)"
fi

# Nothing in the image needs the package caches; they only make it bigger.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
       "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/var/log/*.log

tar --numeric-owner -C "$root" -c . \
    | "$docker" import \
        -c 'CMD ["python3"]' \
        -c 'ENV LANG=C.UTF-8' \
        -c "LABEL cumatrix.base=$hash cumatrix.base.suite=$suite" \
        -m "cumatrix base: debootstrap $suite $variant +$include" \
        - "$tag" >/dev/null

echo "$tag"
