"""Fixtures for the docker runtime tests: a real Docker engine and the locally built test image.

`make test` runs `make docker-engine test-image` first. Where that could not happen (not root, no
apt-get, no engine) these tests skip with the reason the setup scripts recorded; with
SPARKCTL_REQUIRE_DOCKER=1 they fail instead, so a run that must exercise Docker cannot pass by skipping.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from dockerkit import TEST_IMAGE, managed_container_ids, recorded_reason

from sparkctl.errors import RuntimeFailure
from sparkctl.runtimes.docker import connect


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("SPARKCTL_REQUIRE_DOCKER") == "1":
        pytest.fail(f"{reason} (SPARKCTL_REQUIRE_DOCKER=1)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client():
    try:
        client = connect(timeout_s=10)
    except RuntimeFailure as exc:
        why = recorded_reason("engine") or "run `make docker-engine` as root to start one"
        _skip_or_fail(f"docker tests need a Docker engine: {exc} ({why})")
    yield client
    client.close()


@pytest.fixture(scope="session")
def test_image(docker_client) -> str:
    from docker.errors import ImageNotFound

    try:
        docker_client.images.get(TEST_IMAGE)
    except ImageNotFound:
        why = recorded_reason("test-image") or "run `make test-image` as root"
        _skip_or_fail(f"docker tests need the local image {TEST_IMAGE}: {why}")
    return TEST_IMAGE


@pytest.fixture
def no_leaks(docker_client) -> Iterator[None]:
    """Fail a test that leaves a container of ours behind (and remove it, so the next test is clean)."""
    before = managed_container_ids(docker_client)
    yield
    leaked = managed_container_ids(docker_client) - before
    for cid in leaked:
        docker_client.containers.get(cid).remove(force=True)
    assert not leaked, f"containers left behind: {sorted(c[:12] for c in leaked)}"
