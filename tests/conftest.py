"""Root of the test suite. Having a conftest here puts `tests/` on sys.path, so the suite's few shared helper
modules (`plans`, `ctrl_c`, `procs`) import from any test directory; it also holds the one isolation fixture and
the guard that keeps the test tiers honest (`pytest_runtest_setup` / `pytest_runtest_call`)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# prewarm's import asks ctypes for libc, which runs `ldconfig -p`: imported here, at collection, so a test that first
# imports it lazily (through a CLI command) does not trip the process guard below.
import prewarm  # noqa: F401

TESTS = Path(__file__).resolve().parent
# These reuse the machine's JIT build of the EXL3 CUDA extension, kept under the sparkctl cache: a fresh
# cache per test would recompile it (minutes on a GPU machine). Their state directory is still isolated.
SHARED_CACHE = {"kernels", "plugin"}


@pytest.fixture(autouse=True)
def isolated_dirs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test runs with sparkctl's state and cache directories in a fresh temp dir and no user recipe
    directory, so no test sees (or leaves) a server, a log or a generated model of another one or of the
    user. Returns that root."""
    root = tmp_path_factory.mktemp("sparkctl")
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(root / "state"))
    try:
        top = Path(str(request.node.path)).resolve().relative_to(TESTS).parts[0]
    except ValueError:
        top = ""
    if top not in SHARED_CACHE:
        monkeypatch.setenv("SPARKCTL_CACHE_DIR", str(root / "cache"))
    monkeypatch.delenv("SPARKCTL_RECIPES_DIR", raising=False)
    return root


# The markers that allow a test to start a process (pyproject.toml, [tool.pytest.ini_options] markers). `make
# test-fast` deselects them, so what it runs starts none.
PROCESS_MARKERS = ("slow", "e2e", "docker", "gpu")
_SPAWNERS = [(subprocess.Popen, "_execute_child"), (os, "fork"), (os, "posix_spawn"), (os, "posix_spawnp")]


@contextmanager
def _no_process(item: pytest.Item) -> Iterator[None]:
    """While active, starting a process (subprocess, asyncio's, a fork) raises, naming the test and the markers."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(
            f"{item.nodeid} starts a process but has none of the markers {', '.join(PROCESS_MARKERS)}: mark it "
            "(pytest.mark.slow when it only needs a local process) so make test-fast leaves it out"
        )

    saved = [(owner, name, getattr(owner, name)) for owner, name in _SPAWNERS if hasattr(owner, name)]
    for owner, name, _ in saved:
        setattr(owner, name, refuse)
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that needs vLLM is also slow: importing vLLM starts processes (its platform probes) and takes seconds."""
    for item in items:
        if item.get_closest_marker("vllm") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


def _guarded(item: pytest.Item) -> bool:
    return not any(item.get_closest_marker(m) for m in PROCESS_MARKERS)


# The guard that keeps the tiers true: a test without one of PROCESS_MARKERS that starts a process, in its own
# body or in a fixture set up for it (module- and session-scoped ones included, which is why this is a hook and
# not a fixture), fails at that call. Why: `make test-fast` promises tests that start nothing, and a marker
# forgotten on a new test would quietly bring sshd or a server back into it. Teardown is left alone: a shared
# fixture started for a marked test may be torn down after an unmarked one.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if not _guarded(item):
        yield
        return
    with _no_process(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if not _guarded(item):
        yield
        return
    with _no_process(item):
        yield
