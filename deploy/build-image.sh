#!/usr/bin/env bash
# Build the node image (`make image` runs this).
#
#   PYTHON=.venv/bin/python deploy/build-image.sh
#
# 1. Wheels: the project and every dependency as wheels in build/image/wheels,
#    for the Docker engine's CPU and Python 3.11, whatever the host is.
# 2. Base: BASE_IMAGE (python:3.11-slim) when the engine has it or can pull
#    it; otherwise the local one deploy/base-image.sh builds from Debian
#    packages (LOCAL_BASE_IMAGE). It says which.
# 3. `docker build --network none`: the build installs from the wheels alone,
#    and proves it by having no network.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim}
LOCAL_BASE_IMAGE=${LOCAL_BASE_IMAGE:-pydledger-base:python3.11-bookworm}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE=${IMAGE:-pydledger:$VERSION}
# Also tag pydledger:latest, which deploy/docker-compose.yml runs by default.
TAG_LATEST=${TAG_LATEST:-yes}
INSTALL_STAGE_IMAGE=pydledger-build:install
CONTEXT=build/image
WHEELS=$CONTEXT/wheels
# How long a pull may take before we call the registry unreachable.
PULL_TIMEOUT_S=${PULL_TIMEOUT_S:-60}

say() { echo "image: $*" >&2; }

build_wheels() {
    local arch
    arch=$(docker info --format '{{.Architecture}}')   # x86_64 or aarch64
    # Stale build/lib files would end up in the project wheel.
    rm -rf "$WHEELS/project" build/lib build/bdist.*
    mkdir -p "$WHEELS/project" "$WHEELS/deps"
    # A fixed timestamp makes the wheel of unchanged code byte-identical, so
    # that the image build finds it in its cache.
    SOURCE_DATE_EPOCH=315532800 "$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps \
        --wheel-dir "$WHEELS/project" .
    # Dependencies as binary wheels for the engine's platform (glibc 2.28 or
    # later, as both bases have: numpy 2.3+ ships no manylinux2014 wheels), pinned by
    # pyproject.toml and, for what they pull in, deploy/constraints.txt;
    # wheels already there are kept (and stay cached in the image build).
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
        --platform "manylinux2014_$arch" --platform "manylinux_2_28_$arch" --python-version 3.11 \
        --implementation cp --abi cp311 \
        --constraint deploy/constraints.txt --dest "$WHEELS/deps" "$WHEELS/project/"*.whl
    rm -f "$WHEELS/deps/"pydledger-*.whl
    say "wheels for $arch in $WHEELS: $(ls "$WHEELS/deps" "$WHEELS/project" | grep -c '\.whl$')"
}

choose_base() {
    if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        say "base: $BASE_IMAGE (official, present)"
        echo "$BASE_IMAGE"
    elif timeout "$PULL_TIMEOUT_S" docker pull --quiet "$BASE_IMAGE" >/dev/null 2>&1; then
        say "base: $BASE_IMAGE (official, pulled)"
        echo "$BASE_IMAGE"
    else
        say "base: $BASE_IMAGE cannot be pulled; using the local $LOCAL_BASE_IMAGE (deploy/base-image.sh)"
        deploy/base-image.sh "$LOCAL_BASE_IMAGE"
        echo "$LOCAL_BASE_IMAGE"
    fi
}

main() {
    local started=$SECONDS base
    build_wheels
    base=$(choose_base)
    say "building $IMAGE on $base"
    # The install stage is tagged too: untagged, it would be pruned below
    # with the build cache that makes the next build take seconds.
    local tags="--tag $IMAGE"
    [ "$TAG_LATEST" = yes ] && tags="$tags --tag pydledger:latest"
    for target in "--target install --tag $INSTALL_STAGE_IMAGE" "$tags"; do
        # shellcheck disable=SC2086 # $target is two or four words
        docker build --quiet --network none --file deploy/Dockerfile \
            --build-arg BASE_IMAGE="$base" $target "$CONTEXT" >/dev/null
    done
    # The images these replaced (untagged now) are of no further use.
    docker image prune --force --filter label=io.pydledger.stage >/dev/null
    say "built $IMAGE$([ "$TAG_LATEST" = yes ] && echo " (also pydledger:latest)") in $((SECONDS - started)) s"
}

main
