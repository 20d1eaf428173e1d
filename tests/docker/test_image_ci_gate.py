"""`make test` builds the real Spark image (scripts/image-ci.sh), gated by the image's content-hash tag.

The gate must build on a fresh clone whose HEAD is origin/main when this engine lacks the image (no git
diff can see that), skip in seconds when the image for the tree exists, and not be fooled by edits that
are no input of the image (README, Makefile, kernel docs) nor miss those that are (a kernel source,
sparkctl). Run against the real script, `make`, the real CLI and the real engine; the 10 GB build itself
is what `make test` did before these tests ran.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dockerkit import REPO, SETUP_CACHE

SCRIPT = REPO / "scripts" / "image-ci.sh"
SPARK_BASE = "sparkctl-base:bookworm-py311"


def run_gate(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


def check(root: Path, base: str) -> tuple[int, dict]:
    """`sparkctl build --check --json` as the checkout at `root` computes it."""
    env = {**os.environ, "PYTHONPATH": f"{root}:{root / 'kernels'}"}
    proc = subprocess.run(
        [sys.executable, "-m", "sparkctl", "build", "--base", base, "--check", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=root,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_make_test_builds_the_image_before_the_tests(tmp_path) -> None:
    """CI runs exactly `make test`: the image build must be one of its steps, before pytest."""
    venv = tmp_path / "venv"  # -n prints the recipes without running them; nothing lands in the repo
    proc = subprocess.run(
        ["make", "-n", "test", f"VENV={venv}"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    gate = f"SPARKCTL={venv}/bin/sparkctl scripts/image-ci.sh {SPARK_BASE}"
    assert gate in lines, proc.stdout
    pytest_line = next(n for n, ln in enumerate(lines) if "-m pytest" in ln)
    assert lines.index(gate) < pytest_line


def test_no_engine_skips_with_its_reason_unless_required(tmp_path) -> None:
    """Where no base can be made (here: no engine answering) the build is skipped with that reason and
    sparkctl is never asked; SPARKCTL_REQUIRE_DOCKER=1 makes it a failure, as for the docker tests."""
    called = tmp_path / "sparkctl-was-called"
    fake = tmp_path / "sparkctl"
    fake.write_text(f"#!/bin/sh\ntouch {called}\nexit 99\n")
    fake.chmod(0o755)
    env = {
        "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "SPARKCTL": str(fake),
        "SPARKCTL_REQUIRE_DOCKER": "",
    }
    proc = run_gate(env)
    assert proc.returncode == 0, proc.stderr
    assert "image-ci: unavailable: no local base image: no Docker engine answering" in proc.stderr
    status = (tmp_path / "cache" / "sparkctl" / "docker" / "image-ci.status").read_text()
    assert status.startswith("unavailable\tno local base image: no Docker engine answering")
    proc = run_gate({**env, "SPARKCTL_REQUIRE_DOCKER": "1"})
    assert proc.returncode == 1, proc.stderr
    assert not called.exists()


@pytest.mark.docker
def test_the_tag_follows_the_image_inputs_only(docker_client, test_image, tmp_path) -> None:
    """A copy of the checkout computes the same tag as the repository; editing the README, the Makefile or
    a kernel doc keeps it (no rebuild), editing a kernel source or sparkctl changes it and `--check` says
    `not built` (exit 1): that is what makes a fresh clone without the image build it."""
    from sparkctl.image.spark import spark_spec

    spec, _ = spark_spec(None, base=test_image)
    copy = tmp_path / "checkout"
    for rel in [*spec.files(), "README.md", "Makefile", "kernels/README.md"]:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, copy / rel)

    rc, here = check(REPO, test_image)
    rc_copy, there = check(copy, test_image)
    assert (rc_copy, there["tag"]) == (rc, here["tag"])

    for doc in ("README.md", "Makefile", "kernels/README.md"):
        with open(copy / doc, "a") as f:
            f.write("\n# an edit that is no input of the image\n")
    assert check(copy, test_image)[1]["tag"] == here["tag"]

    seen = {here["tag"]}
    for source in ("kernels/csrc/exl3_gemv.cu", "sparkctl/pins.py"):
        with open(copy / source, "a") as f:
            f.write("\n// changed\n" if source.endswith(".cu") else "\n# changed\n")
        rc_edit, edited = check(copy, test_image)
        assert rc_edit == 1 and not edited["up_to_date"], edited
        assert edited["tag"] not in seen
        seen.add(edited["tag"])


@pytest.mark.docker
def test_an_unchanged_tree_skips_in_seconds(docker_client) -> None:
    """After `make test`'s image-ci step, the gate run again finds the image for this tree and builds
    nothing: the tests that ran in between changed no input (no file written into the build context)."""
    status = SETUP_CACHE / "image-ci.status"
    try:
        state, _, detail = status.read_text().strip().partition("\t")
    except OSError:
        pytest.skip("`make image-ci` (part of `make test`) has not run on this machine")
    if state != "ready":
        pytest.skip(f"`make image-ci` could not build here: {detail}")
    rc, now = check(REPO, SPARK_BASE)
    if rc == 1 and now["tag"] != detail:
        pytest.skip(f"the tree changed since `make image-ci` built {detail} (it would build {now['tag']})")
    assert rc == 0 and now["tag"] == detail, now
    start = time.monotonic()
    proc = run_gate({"SPARKCTL": f"{sys.executable} -m sparkctl", "PYTHONPATH": f"{REPO}:{REPO / 'kernels'}"})
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert f"image-ci: skipped: {detail}: up to date" in proc.stderr
    assert took < 60, f"the skip took {took:.0f}s"
