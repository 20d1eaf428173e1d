"""An installed wheel (no checkout next to it) still finds the built-in recipes.

Builds a wheel from a copy of the source tree, installs it into a fresh virtual environment whose
dependencies come from the dev venv through a path entry (so the editable install is not active
there), and runs `python -m sparkctl list --json` from an unrelated directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

# starts processes (tests/conftest.py, the process guard): not in make test-fast
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SOURCES = ["pyproject.toml", "README.md", "sparkctl", "prewarm", "recipes", "kernels/sparkctl_exl3"]


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert proc.returncode == 0, f"{cmd}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    return proc


def test_recipes_are_found_from_an_installed_wheel(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for rel in SOURCES:
        origin = REPO / rel
        if origin.is_dir():
            shutil.copytree(origin, src / rel, ignore=shutil.ignore_patterns("__pycache__", "build", "*.so"))
        else:
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, src / rel)
    wheels = tmp_path / "wheels"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(src),
        ],
        env=env,
    )
    (wheel,) = wheels.glob("sparkctl-*.whl")

    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(target)
    py = target / "bin" / "python"
    site = Path(
        run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    )
    # dependencies (pydantic, yaml, rich, click) from the dev venv, without its editable sparkctl finder
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(
        # --ignore-installed: without it pip uninstalls the dev venv's editable sparkctl first
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--ignore-installed",
            "--prefix",
            str(target),
            str(wheel),
        ],
        env=env,
    )

    out = run([str(py), "-m", "sparkctl", "list", "--json"], cwd=tmp_path, env={**env, "PYTHONPATH": ""})
    rows = json.loads(out.stdout)
    names = {r["name"] for r in rows}
    assert {"tiny", "glm-5.3-flash", "qwen3.8-flash-next"} <= names
    assert all(r["error"] is None for r in rows)
    paths = {Path(r["path"]).parent for r in rows}
    assert paths == {target / "share" / "sparkctl" / "recipes"}
    where = run([str(py), "-c", "import sparkctl; print(sparkctl.__file__)"], cwd=tmp_path).stdout.strip()
    assert where.startswith(str(site)), where  # the wheel's copy, not the checkout
