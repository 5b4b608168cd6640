"""The node image, built once per test session for every Docker test (a build
takes a minute or more here; the secure and plain compose tests share it),
and the Spark image on top of it for the Spark compose test."""
from __future__ import annotations

import secrets
from typing import Iterator

import pytest

from tests.docker.compose import BuiltImage, build_image, run


@pytest.fixture(scope="session")
def image() -> Iterator[BuiltImage]:
    """The node image under a tag of this run's own (the layers are shared
    with `make image`'s, so removing the tag afterwards costs nothing)."""
    tag = f"pydledger:e2e-{secrets.token_hex(4)}"
    try:
        yield BuiltImage(tag, build_image(tag))
    finally:
        run("docker", "rmi", tag, check=False)


@pytest.fixture(scope="session")
def spark_image(image: BuiltImage) -> Iterator[BuiltImage]:
    """The Spark image (master, workers, replay driver) on top of the node image."""
    tag = f"pydledger-spark:e2e-{secrets.token_hex(4)}"
    try:
        yield BuiltImage(tag, build_image(tag, "build-spark-image.sh", NODE_IMAGE=image.tag))
    finally:
        run("docker", "rmi", tag, check=False)
