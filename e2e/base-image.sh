#!/usr/bin/env bash
# Makes sure the Docker engine has debian:bookworm-slim, the base of the
# top-level Dockerfile, without pulling from a registry: when the image is
# missing, it is built locally with debootstrap from Debian's package mirror
# and loaded with `docker import`. Idempotent: an existing image is left alone.
#
# Usage: bash e2e/base-image.sh   (as root: debootstrap needs it)
# Environment: PROPIO_DEBIAN_MIRROR and PROPIO_DEBIAN_SECURITY_MIRROR override
# the mirrors (defaults http://deb.debian.org/debian and
# http://deb.debian.org/debian-security); the image's apt sources use them too.
set -euo pipefail

image=debian:bookworm-slim
suite=bookworm
mirror=${PROPIO_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${PROPIO_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

say() { printf 'base-image: %s\n' "$*" >&2; }

if docker image inspect "$image" >/dev/null 2>&1; then
  say "$image is already present; nothing to do"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  say "$image is missing and building it with debootstrap needs root"
  exit 1
fi

if ! command -v debootstrap >/dev/null 2>&1; then
  say "installing debootstrap with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/propio-base-image.XXXXXX")
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
rootfs=$work/rootfs

say "debootstrap --variant=minbase $suite into $rootfs from $mirror (about a minute on a fast mirror)"
start=$SECONDS
if ! debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1; then
  say "debootstrap failed; the end of its log:"
  tail -30 "$work/debootstrap.log" >&2
  exit 1
fi
say "debootstrap took $((SECONDS - start))s"

say "trimming apt lists, caches, docs and logs"
rm -rf "$rootfs"/var/lib/apt/lists/* \
  "$rootfs"/var/cache/apt/*.bin \
  "$rootfs"/var/cache/apt/archives/*.deb \
  "$rootfs"/var/cache/debconf/*-old \
  "$rootfs"/var/log/* \
  "$rootfs"/usr/share/man/* \
  "$rootfs"/usr/share/info/* \
  "$rootfs"/tmp/* \
  "$rootfs"/debootstrap
find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
# Like the registry's slim image: packages installed later skip docs, man
# pages and translations (copyright files stay), and apt keeps no .deb files.
mkdir -p "$rootfs/etc/dpkg/dpkg.cfg.d" "$rootfs/etc/apt/apt.conf.d"
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
# debootstrap copies the host's resolver and hostname; the engine provides its own.
: >"$rootfs/etc/resolv.conf"
: >"$rootfs/etc/hostname"
# apt inside the image uses these mirrors, with updates and security fixes,
# as the registry's debian:bookworm-slim does.
cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security_mirror $suite-security main
EOF

say "importing the root filesystem as $image"
tar --numeric-owner -C "$rootfs" -c . |
  docker import --change 'CMD ["bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$image" >/dev/null
docker image ls "$image" >&2
say "done in $((SECONDS - start))s"
