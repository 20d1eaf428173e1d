"""Running the real `sparkctl` as a subprocess against a test's own state and cache directories, and recipes
that run a small Python program as their engine: shared by the tests that drive `up`/`down` from outside."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def sparkctl_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment with sparkctl's state and cache under `tmp_path`, unbuffered, plus `extra`."""
    return {
        **os.environ,
        "SPARKCTL_STATE_DIR": str(tmp_path / "state"),
        "SPARKCTL_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def run_in_env(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`sparkctl ARGS` to completion in the repo, in exactly `env`."""
    return subprocess.run(
        [sys.executable, "-m", "sparkctl", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def run_sparkctl(
    tmp_path: Path, *args: str, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    """`sparkctl ARGS` to completion in the repo, with sparkctl_env(tmp_path, **env)."""
    return run_in_env(sparkctl_env(tmp_path, **env), *args, timeout=timeout)


def engine_recipe(tmp_path: Path, name: str, engine_code: str, *, health_timeout: float) -> Path:
    """A recipe that extends the built-in `tiny` but runs `python -c engine_code` as its engine."""
    entry = json.dumps([sys.executable, "-c", textwrap.dedent(engine_code)])
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"schema: 1\nextends: {REPO / 'recipes' / 'tiny.yaml'}\nname: {name}\n"
        f"engine:\n  entrypoint: {entry}\nserve:\n  health_timeout_s: {health_timeout}\n"
    )
    return path
