#!/bin/sh
# Make a local stand-in for python:3.11-slim-bookworm where no registry is
# reachable: Debian bookworm (minbase) with its python3 (3.11) and venv, built
# by debootstrap and imported into podman. Run as root.
#
#   docker/base-image.sh TAG [MIRROR]
#   podman build --build-arg BASE_IMAGE=TAG ...
#
# The Dockerfile needs only `python3 -m venv` and `useradd` from its base image.
set -eu
tag=${1:?usage: $0 TAG [MIRROR]}
mirror=${2:-http://deb.debian.org/debian}
root=$(mktemp -d "${TMPDIR:-/tmp}/mmserver-rootfs.XXXXXX")
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv \
    bookworm "$root" "$mirror" >"$root.log" 2>&1 || { cat "$root.log"; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# No apt lists or caches in the image, like the official slim images.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
tar --numeric-owner -C "$root" -c . | podman import \
    --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' - "$tag" >/dev/null
echo "$tag"
