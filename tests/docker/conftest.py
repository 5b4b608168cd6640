"""The node image, built once per test session for every Docker test (a build
takes a minute or more here; the secure and plain compose tests share it)."""
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
