#!/usr/bin/env bash
# Build the Spark image (`make image-spark` runs this) from the node image.
#
#   PYTHON=.venv/bin/python NODE_IMAGE=pydledger:0.1.0 deploy/build-spark-image.sh
#
# 1. The node image: NODE_IMAGE when the engine has it, else deploy/build-image.sh makes it.
# 2. The Spark runtime (deploy/Dockerfile.spark), which does not depend on the
#    project's code: reused when an image with the same recipe (a hash of
#    the pins, the Dockerfile, the JDK, the Java modules and the node
#    image's base) exists; otherwise made from
#    - wheels: pyspark (an sdist on PyPI, built here once; pip's cache keeps
#      the built wheel), py4j and pyarrow, at the versions pyproject.toml's
#      `spark` extra and deploy/constraints.txt pin, in build/spark-image/wheels,
#      installed here (pip --target, for the engine's platform) into
#      build/spark-image/spark-python, which the image copies as it is (an
#      install inside the build would commit those 700 MB twice);
#    - a Java 17 runtime: jlink from the host's JDK (the one Spark already
#      needs here) makes build/spark-image/jre with just the modules Spark
#      uses; it needs only glibc, libstdc++ and zlib, which every base here has;
#    and `docker build --network none` on the node image's base.
# 3. The image (deploy/Dockerfile.spark-app): the runtime plus the node
#    image's virtualenv, a .pth file that points it at Spark's packages, and
#    the JVM reader's jar for file mode, compiled here
#    (spark/jvm_reader.py: javac against pyspark's jars, the same version as
#    the image's) into build/spark-app; without a JDK the image has no jar and
#    file mode reads with the Python reader. Seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
NODE_IMAGE=${NODE_IMAGE:-pydledger:$VERSION}
IMAGE=${IMAGE:-pydledger-spark:$VERSION}
TAG_LATEST=${TAG_LATEST:-yes}
CONTEXT=build/spark-image
APP_CONTEXT=build/spark-app
# Java modules the Spark master, workers, executors and driver load (Java SE,
# sun.misc.Unsafe, the vector API Spark's launcher adds, EC crypto for TLS).
JAVA_MODULES=java.se,jdk.unsupported,jdk.incubator.vector,jdk.crypto.ec,jdk.zipfs,jdk.management,jdk.naming.dns,jdk.security.auth

RUNTIME_REPO=pydledger-spark-runtime

say() { echo "spark-image: $*" >&2; }

spark_requirements() {
    # pyproject's `spark` extra, plus py4j (pyspark's one dependency) as constrained.
    "$PYTHON" - <<'EOF'
import re, tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["spark"]
print("\n".join(extra))
print(next(l.strip() for l in open("deploy/constraints.txt") if re.match(r"py4j==", l)))
EOF
}

build_wheels() {
    local arch requirements
    arch=$(docker info --format '{{.Architecture}}')
    requirements=$(spark_requirements)
    mkdir -p "$CONTEXT/wheels"
    # Only the pinned versions stay in the context (an old wheel would be installed too).
    find "$CONTEXT/wheels" -name '*.whl' -print0 | while IFS= read -r -d '' wheel; do
        name=$(basename "$wheel" | cut -d- -f1-2 | tr _ -)
        grep -qix "$(echo "$name" | sed 's/-/==/')" <<<"$requirements" || rm -f "$wheel"
    done
    # pyspark is pure Python (one wheel for every platform); pyarrow is binary.
    # shellcheck disable=SC2086
    "$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$CONTEXT/wheels" \
        $(grep -i '^pyspark==' <<<"$requirements") $(grep -i '^py4j==' <<<"$requirements")
    # shellcheck disable=SC2086
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --platform "manylinux2014_$arch" --platform "manylinux_2_28_$arch" --python-version 3.11 \
        --implementation cp --abi cp311 --dest "$CONTEXT/wheels" $(grep -i '^pyarrow==' <<<"$requirements")
    say "wheels: $(cd "$CONTEXT/wheels" && ls ./*.whl | xargs -n1 basename | tr '\n' ' ')"
}

install_wheels() {
    # The wheels' files as the image holds them at /opt/spark-python, for
    # the engine's Python (3.11) and platform whatever the host's are.
    local arch
    arch=$(docker info --format '{{.Architecture}}')
    rm -rf "$CONTEXT/spark-python"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --only-binary=:all: \
        --platform "manylinux2014_$arch" --platform "manylinux_2_28_$arch" --python-version 3.11 \
        --implementation cp --abi cp311 --target "$CONTEXT/spark-python" "$CONTEXT/wheels/"*.whl
    chmod 0755 "$CONTEXT/spark-python/pyspark/bin/"* "$CONTEXT/spark-python/pyspark/sbin/"*
    # The build reads jre/ and spark-python/ only: the wheels stay out of the
    # context sent to the engine.
    echo wheels > "$CONTEXT/.dockerignore"
}

java_home() {
    if [ -n "${JAVA_HOME:-}" ]; then echo "$JAVA_HOME"; return; fi
    dirname "$(dirname "$(readlink -f "$(command -v java)")")"
}

build_jre() {
    local jdk release
    jdk=$(java_home)
    [ -x "$jdk/bin/jlink" ] && [ -d "$jdk/jmods" ] || {
        say "no jlink and jmods under $jdk: install a JDK 17 (Debian: openjdk-17-jdk-headless) or set JAVA_HOME"
        exit 1
    }
    release=$(sed -n 's/^JAVA_VERSION="\(.*\)"/\1/p' "$jdk/release")
    case "$release" in 17*) ;; *) say "$jdk is Java $release; Spark 4 here runs on Java 17"; exit 1 ;; esac
    # Made again only when the JDK or the module list changed.
    local stamp="$jdk $release $JAVA_MODULES"
    if [ -f "$CONTEXT/jre/.pydledger-stamp" ] && [ "$(cat "$CONTEXT/jre/.pydledger-stamp")" = "$stamp" ]; then
        return
    fi
    rm -rf "$CONTEXT/jre"
    "$jdk/bin/jlink" --add-modules "$JAVA_MODULES" --strip-debug --no-man-pages --no-header-files \
        --compress=2 --output "$CONTEXT/jre"
    echo "$stamp" > "$CONTEXT/jre/.pydledger-stamp"
    say "Java $release runtime from $jdk: $(du -sh "$CONTEXT/jre" | cut -f1)"
}

node_base() {
    docker image inspect --format '{{ index .Config.Labels "io.pydledger.base" }}' "$NODE_IMAGE"
}

recipe() {
    # Everything the runtime is made of, without making it.
    local base=$1 jdk
    jdk=$(java_home)
    { spark_requirements; cat deploy/Dockerfile.spark; echo "$JAVA_MODULES"; cat "$jdk/release";
      docker image inspect --format '{{.Id}}' "$base"; } | sha256sum | cut -c1-16
}

build_runtime() {
    local base=$1 runtime=$2
    build_wheels
    install_wheels
    build_jre
    docker build --quiet --network none --file deploy/Dockerfile.spark \
        --build-arg BASE_IMAGE="$base" --tag "$runtime" "$CONTEXT" >/dev/null
}

build_jar() {
    local jar
    rm -rf "$APP_CONTEXT" && mkdir -p "$APP_CONTEXT"
    echo "The Spark image's own files (deploy/build-spark-image.sh)." > "$APP_CONTEXT/README"
    echo /opt/spark-python > "$APP_CONTEXT/pydledger-spark.pth"
    jar=$("$PYTHON" -c 'from spark.jvm_reader import jar_path; print(jar_path() or "")' 2>/dev/null || true)
    if [ -n "$jar" ]; then
        cp "$jar" "$APP_CONTEXT/pydledger-spark.jar"
        say "the JVM reader's jar: $jar"
    else
        say "no JVM reader jar (no JDK here?): file mode in the image reads with the Python reader"
    fi
}

main() {
    local started=$SECONDS base runtime
    if ! docker image inspect "$NODE_IMAGE" >/dev/null 2>&1; then
        say "no $NODE_IMAGE yet: building the node image first"
        IMAGE=$NODE_IMAGE deploy/build-image.sh
    fi
    base=$(node_base)
    [ -n "$base" ] || { say "$NODE_IMAGE has no io.pydledger.base label: rebuild it with deploy/build-image.sh"; exit 1; }
    runtime="$RUNTIME_REPO:$(recipe "$base")"
    if docker image inspect "$runtime" >/dev/null 2>&1; then
        say "runtime $runtime is up to date; reusing it"
    else
        say "building the runtime $runtime on $base"
        build_runtime "$base" "$runtime"
    fi
    build_jar
    local tags="--tag $IMAGE"
    [ "$TAG_LATEST" = yes ] && tags="$tags --tag pydledger-spark:latest"
    # shellcheck disable=SC2086
    docker build --quiet --network none --build-arg NODE_IMAGE="$NODE_IMAGE" \
        --build-arg RUNTIME_IMAGE="$runtime" $tags --file deploy/Dockerfile.spark-app "$APP_CONTEXT" >/dev/null
    docker image prune --force --filter label=io.pydledger.stage >/dev/null
    say "built $IMAGE on $NODE_IMAGE in $((SECONDS - started)) s ($(docker image inspect --format '{{.Size}}' "$IMAGE" \
        | awk '{printf "%.0f MB", $1/1e6}'))"
}

main
