#!/usr/bin/env bash
# Builds the holdfast container image from a binary built on this machine, and prints its size.
#
#   cluster/image.sh [BINARY]
#
# BINARY: the holdfast binary to put in the image; default $HOLDFAST_BIN, else target/release/holdfast if
# it exists, else target/debug/holdfast (build one first: `cargo build --release -p holdfast`).
# The image is tagged $HOLDFAST_IMAGE (default holdfast:local), the name cluster/docker-compose.yml runs.
#
# Nothing is pulled: the image is FROM scratch, with the binary, the shared libraries it links (the build
# machine's glibc: run the image on the same architecture) and the few files deploy/docker/rootfs.sh
# stages. The build context is a temporary directory holding only cluster/Dockerfile and rootfs.tar.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

binary=${1:-${HOLDFAST_BIN:-}}
if [[ -z $binary ]]; then
    for candidate in "$root/target/release/holdfast" "$root/target/debug/holdfast"; do
        if [[ -x $candidate ]]; then
            binary=$candidate
            break
        fi
    done
fi
if [[ -z $binary ]]; then
    echo "image.sh: no holdfast binary; build one first (cargo build --release -p holdfast) or pass its path" >&2
    exit 1
fi
image=${HOLDFAST_IMAGE:-holdfast:local}
NONROOT_ID=65532

context=$(mktemp -d "${TMPDIR:-/tmp}/holdfast-image.XXXXXX")
trap 'rm -rf "$context"' EXIT

"$root/deploy/docker/rootfs.sh" "$binary" "$context/rootfs" >/dev/null
# Owners are set in the archive, so that this works without root: everything root's, but /data and /tmp,
# which belong to the user the server runs as (a new named volume on /data takes the owner of the image's).
tar --create --file "$context/rootfs.tar" --directory "$context/rootfs" --numeric-owner --owner=0 --group=0 \
    --exclude=./data --exclude=./tmp .
tar --append --file "$context/rootfs.tar" --directory "$context/rootfs" --numeric-owner \
    --owner="$NONROOT_ID" --group="$NONROOT_ID" ./data ./tmp
cp "$root/cluster/Dockerfile" "$context/Dockerfile"

previous=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
echo "image.sh: building $image from $binary"
# Docker's legacy builder warns that it is deprecated when buildx is not installed; both builders work.
docker build --quiet --tag "$image" "$context" >/dev/null
current=$(docker image inspect --format '{{.Id}}' "$image")
# A rebuild leaves the previous image untagged: remove it, unless a container still uses it.
if [[ -n $previous && $previous != "$current" ]]; then
    docker image rm "$previous" >/dev/null 2>&1 || true
fi
size=$(docker image inspect --format '{{.Size}}' "$image")
echo "image.sh: $image ($current) is $((size / 1024 / 1024)) MiB ($size bytes)"
