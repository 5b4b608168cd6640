#!/usr/bin/env bash
# Build a local Python 3.11 base image from Debian 12 packages, for Docker
# engines that cannot pull python:3.11-slim (no registry, no network).
#
#   deploy/base-image.sh [IMAGE]      (default: $LOCAL_BASE_IMAGE or pydledger-base:python3.11-bookworm)
#
# debootstrap makes a minimal bookworm rootfs holding python3.11, venv and
# pip; `docker import` turns it into an image. The interpreter is laid out the
# way the official image has it (python3.11, python3, python, pip in
# /usr/local/bin, pip allowed to install system-wide), so deploy/Dockerfile
# builds on either base unchanged.
#
# Idempotent: the image is labelled with a hash of this script, and an image
# with the current hash is reused as it is. Needs root (debootstrap chroots)
# and a Debian mirror (DEBIAN_MIRROR, default deb.debian.org); installs
# debootstrap with apt-get when it is missing.
set -euo pipefail

IMAGE=${1:-${LOCAL_BASE_IMAGE:-pydledger-base:python3.11-bookworm}}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The smallest set that gives the official image's Python: the interpreter,
# venv (ensurepip's wheels) and pip. Everything else comes from minbase
# (Priority: required), which has no init, no systemd, no docs tooling.
PACKAGES=python3.11,python3-venv,python3-pip
RECIPE_LABEL=io.pydledger.base-recipe
RECIPE=$(sha256sum "$0" | cut -c1-16)

say() { echo "base-image: $*" >&2; }

existing_recipe() {
    docker image inspect --format "{{ index .Config.Labels \"$RECIPE_LABEL\" }}" "$IMAGE" 2>/dev/null || true
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

ensure_debootstrap() {
    command -v debootstrap >/dev/null && return
    say "installing debootstrap with apt-get"
    as_root apt-get install -y --no-install-recommends debootstrap >/dev/null \
        || { as_root apt-get update >/dev/null && as_root apt-get install -y --no-install-recommends debootstrap >/dev/null; }
}

cleanup() {
    # debootstrap mounts proc and sys inside the target and leaves them
    # mounted when it fails: unmount before deleting, and never cross into them.
    [ -n "${ROOTFS:-}" ] && [ -d "$ROOTFS" ] || return 0
    as_root umount -R "$ROOTFS/proc" "$ROOTFS/sys" 2>/dev/null || true
    as_root rm -rf --one-file-system "$ROOTFS" "$ROOTFS.log"
}

# Make the Debian interpreter look like the official image's.
mimic_official_layout() {
    local root=$1
    as_root ln -sf /usr/bin/python3.11 "$root/usr/local/bin/python3.11"
    as_root ln -sf python3.11 "$root/usr/local/bin/python3"
    as_root ln -sf python3 "$root/usr/local/bin/python"
    for name in pip pip3 pip3.11; do
        as_root ln -sf /usr/bin/pip3 "$root/usr/local/bin/$name"
    done
    # The official image lets pip install into the system interpreter; Debian
    # forbids it (PEP 668) unless this marker is gone.
    as_root rm -f "$root/usr/lib/python3.11/EXTERNALLY-MANAGED"
}

# Drop what a container never reads: downloaded .debs (debootstrap keeps
# them), apt lists, manuals, translations, docs but their copyright files.
trim() {
    local root=$1
    as_root rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
        "$root"/usr/share/man "$root"/usr/share/info "$root"/usr/share/locale "$root"/var/log/*.log
    as_root find "$root/usr/share/doc" -type f ! -name copyright -delete
}

import_rootfs() {
    local root=$1 version
    version=$(as_root chroot "$root" python3.11 -c 'import platform; print(platform.python_version())')
    say "importing the rootfs (Python $version) as $IMAGE"
    # /dev, /proc and /sys are provided by the container runtime.
    as_root tar --numeric-owner --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* -C "$root" -c . \
        | docker import \
            --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'ENV LANG=C.UTF-8' \
            --change "ENV PYTHON_VERSION=$version" \
            --change "LABEL $RECIPE_LABEL=$RECIPE" \
            --change "LABEL org.opencontainers.image.description=\"Debian $SUITE minbase with Python $version (deploy/base-image.sh)\"" \
            --change 'CMD ["python3"]' \
            - "$IMAGE" >/dev/null
}

main() {
    if [ "$(existing_recipe)" = "$RECIPE" ]; then
        say "$IMAGE is up to date (recipe $RECIPE); reusing it"
        return
    fi
    ensure_debootstrap
    ROOTFS=$(mktemp -d "${TMPDIR:-/var/tmp}/pydledger-base.XXXXXX")
    trap cleanup EXIT
    # dpkg inside the target skips its fsync per unpacked file (as Docker's
    # own Debian images do): a build cut short is thrown away anyway.
    as_root mkdir -p "$ROOTFS/etc/dpkg/dpkg.cfg.d"
    echo force-unsafe-io | as_root tee "$ROOTFS/etc/dpkg/dpkg.cfg.d/01-pydledger-unsafe-io" >/dev/null
    say "debootstrap $SUITE (minbase + $PACKAGES) from $MIRROR into $ROOTFS"
    local started=$SECONDS
    as_root debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 \
        || { tail -20 "$ROOTFS.log" >&2; say "debootstrap failed"; exit 1; }
    say "debootstrap done in $((SECONDS - started)) s"
    as_root rm "$ROOTFS/etc/dpkg/dpkg.cfg.d/01-pydledger-unsafe-io"
    mimic_official_layout "$ROOTFS"
    trim "$ROOTFS"
    import_rootfs "$ROOTFS"
    say "built $IMAGE in $((SECONDS - started)) s"
}

main
