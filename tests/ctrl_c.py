"""Shared pieces of the tests that interrupt a sparkctl child with SIGINT (what Ctrl-C delivers).

Children that a test interrupts must not inherit an ignored SIGINT: a shell without job control starts
background jobs with SIGINT ignored, the disposition survives exec, and Python then never installs its
KeyboardInterrupt handler: started that way (`bash .ci/run &` from a script, as some CI runners do), every test
that interrupts a child saw it run on to the end and failed. Hence `sigint_default`.

The tests that interrupt the health wait share a recipe whose engine is still "loading" (`slow_engine_recipe`)
and the wait for the launch stage's line (`read_until_launch`), so that the signal lands after the launch.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FAKE_ENGINE = REPO / "tests" / "safety" / "fake_engine.py"


def sigint_default() -> None:
    """`preexec_fn` for subprocess.Popen: give the child SIGINT's default action back."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def slow_engine_recipe(tmp_path: Path, name: str, *engine_flags: str) -> Path:
    """Write `<tmp_path>/<name>.yaml` and return its path: tiny.yaml served by tests/safety/fake_engine.py,
    which sleeps ten minutes before it listens (and a health timeout as long), so that once launched the
    server sits in the health wait until the test interrupts it. `engine_flags` go to the fake engine
    (e.g. `--ignore-sigterm`)."""
    argv = [sys.executable, str(FAKE_ENGINE), *engine_flags, "--slow-start", "600"]
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(
        f"schema: 1\nextends: {REPO / 'recipes' / 'tiny.yaml'}\nname: {name}\n"
        f"engine:\n  entrypoint: {json.dumps(argv)}\nserve:\n  health_timeout_s: 600\n"
    )
    return recipe


def read_until_launch(proc: subprocess.Popen[str]) -> list[str]:
    """Read `proc`'s stderr (a text pipe) up to and including the launch stage's line; return the lines read.

    By then the state file names the engine's pid. If stderr ends first (the process exited before the
    launch), fail with its exit status and everything it said, not with a missing state file later.
    """
    assert proc.stderr is not None, "start the process with stderr=subprocess.PIPE, text=True"
    seen: list[str] = []
    for line in proc.stderr:
        seen.append(line)
        if "launch" in line:
            return seen
    try:
        code: int | None = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # stderr closed but still running: say so rather than hang
        code = None
    pytest.fail(
        f"sparkctl ended its stderr before the launch line (exit status {code}); it said:\n{''.join(seen)}"
    )
