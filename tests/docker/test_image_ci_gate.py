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
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dockerkit import REPO, SETUP_CACHE

from sparkctl.image.context import BASE_ID_LABEL, BASE_LABEL, HASH_LABEL, instructions

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
    env = {
        **os.environ,
        "PYTHONPATH": f"{root}:{root / 'kernels'}",
        "SPARKCTL_RECIPES_DIR": str(REPO / "recipes"),
    }
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


def copy_checkout(dest: Path, base: str) -> Path:
    """The image's inputs (the build context after the ignore file), the gate's scripts and the files the
    context leaves out, copied: a checkout that hashes like the repository."""
    from sparkctl.image.spark import IGNORE_FILE, spark_spec

    spec, _ = spark_spec(None, base=base)
    extra = [IGNORE_FILE, "README.md", "Makefile", "kernels/README.md"]
    extra += [str(p.relative_to(REPO)) for p in (REPO / "scripts").rglob("*.sh")]
    for rel in [*spec.files(), *extra]:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest / rel)
    return dest


def built_tag() -> str:
    """The tag `make image-ci` built (or found) for this tree; skips where it did not run or could not, or
    where the tree has changed since (so no test here ever starts the cold build)."""
    try:
        state, _, detail = (SETUP_CACHE / "image-ci.status").read_text().strip().partition("\t")
    except OSError:
        pytest.skip("`make image-ci` (part of `make test`) has not run on this machine")
    if state != "ready":
        pytest.skip(f"`make image-ci` could not build here: {detail}")
    rc, now = check(REPO, SPARK_BASE)
    if rc == 1 and now["tag"] != detail:
        pytest.skip(f"the tree changed since `make image-ci` built {detail} (it would build {now['tag']})")
    assert rc == 0 and now["tag"] == detail, now
    return detail


@pytest.mark.slow
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


@pytest.mark.slow
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
    copy = copy_checkout(tmp_path / "checkout", test_image)
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
def test_an_unchanged_tree_skips_in_seconds(docker_client, test_image, tmp_path) -> None:
    """After `make test`'s image-ci step, the gate run again finds the image for this tree and builds
    nothing: the tests that ran in between changed no input (no file written into the build context).
    It also removes the images built on an earlier id of the base (never reusable: the id is in their
    tag), here a labelled copy of the test image standing for a stale 10 GB build."""
    detail = built_tag()
    stale = "sparkctl-imagetest/stale:gate"
    (tmp_path / "Dockerfile").write_text(f"FROM {test_image}\n")
    labels = {HASH_LABEL: "stale", BASE_LABEL: SPARK_BASE, BASE_ID_LABEL: "sha256:" + "0" * 64}
    for _ in docker_client.api.build(path=str(tmp_path), tag=stale, labels=labels, decode=True, rm=True):
        pass
    try:
        start = time.monotonic()
        proc = run_gate(
            {"SPARKCTL": f"{sys.executable} -m sparkctl", "PYTHONPATH": f"{REPO}:{REPO / 'kernels'}"}
        )
        took = time.monotonic() - start
        assert proc.returncode == 0, proc.stderr
        assert f"image-ci: skipped: {detail}: up to date" in proc.stderr
        assert took < 60, f"the skip took {took:.0f}s"
        assert f"image-ci: removed {stale} (built on an earlier {SPARK_BASE})" in proc.stderr
        assert not docker_client.api.images(name=stale)
        assert docker_client.api.images(name=test_image)
    finally:
        if docker_client.api.images(name=stale):
            docker_client.api.remove_image(stale, force=True)


@pytest.mark.docker
def test_a_python_edit_builds_only_the_last_layer(docker_client, tmp_path) -> None:
    """The build half of the gate, for real: a checkout whose sparkctl differs from the image's has no
    image, so the gate builds, and only the last layer (sparkctl + the smoke test) runs: the wheel and
    kernel layers come from the cache. Seconds, on the layers `make image-ci` left."""
    here = built_tag()
    copy = copy_checkout(tmp_path / "checkout", SPARK_BASE)
    with open(copy / "sparkctl" / "pins.py", "a") as f:
        f.write("\n# an edit of sparkctl's Python\n")
    rc, edited = check(copy, SPARK_BASE)
    assert rc == 1, edited
    env = {
        "SPARKCTL": f"{sys.executable} -m sparkctl",
        "PYTHONPATH": f"{copy}:{copy / 'kernels'}",
        "SPARKCTL_RECIPES_DIR": str(REPO / "recipes"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),  # its status must not replace make test's
    }
    try:
        proc = subprocess.run(
            ["bash", str(copy / "scripts" / "image-ci.sh")],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, **env},
            cwd=copy,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"image-ci: building: {edited['tag']}: not built yet" in proc.stderr
        assert f"image-ci: built {edited['tag']}" in proc.stderr
        ins = instructions((REPO / "docker" / "Dockerfile").read_text())
        runs = {n: i.text for n, i in enumerate(ins, 1) if i.text.startswith("RUN ")}
        wheels = next(n for n, text in runs.items() if "docker/ensure_deps.py" in text)
        kernel = next(n for n, text in runs.items() if "kernels/build_kernels.py" in text)
        took = dict(re.findall(r"^✓ step\s+(\d+)/\d+ (cached|[\d.]+s) ", proc.stderr, re.M))
        assert took[str(wheels)] == "cached" and took[str(kernel)] == "cached", took
        assert took[str(max(runs))] != "cached"  # sparkctl + the smoke test did run
        assert docker_client.api.inspect_image(edited["tag"])["Config"]["Labels"][HASH_LABEL]
    finally:  # the recipe's name back on the image of this tree, then the edited one removed
        subprocess.run(
            [sys.executable, "-m", "sparkctl", "build", "--base", SPARK_BASE],
            capture_output=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'kernels'}"},
        )
        if docker_client.api.images(name=edited["tag"]):
            docker_client.api.remove_image(edited["tag"])
    assert (
        docker_client.api.inspect_image("sparkctl/vllm-exl3:0.33.0-sm121")["Id"]
        == (docker_client.api.inspect_image(here)["Id"])
    )
