"""`up --persist` of a native recipe: a systemd user unit that runs the plan's argv, removed by `down`.

systemd does not run here, so what can run is tested: the real CLI writes the unit, its ExecStart read
back the way systemd splits it (shlex, after `$$`/`%%`) is the launched server's argv, hostile values
included; `systemd-analyze verify` checks the file where it is installed; `down` removes it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sparkctl_proc import run_sparkctl, sparkctl_env

from sparkctl.server.ports import free_port

# starts processes (tests/conftest.py, the process guard): not in make test-fast
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ENGINE = Path(__file__).with_name("fake_engine.py")
HOSTILE = ["a $HOME b", "100%h", 'q"uote', "back\\slash", "semi;colon", "'single'"]


def _env(tmp_path: Path) -> dict[str, str]:
    return sparkctl_env(tmp_path, XDG_CONFIG_HOME=str(tmp_path / "config"))


def _sparkctl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_sparkctl(tmp_path, *args, XDG_CONFIG_HOME=str(tmp_path / "config"))


def _recipe(tmp_path: Path, *extra: str) -> Path:
    path = tmp_path / "keep.yaml"
    entry = json.dumps([sys.executable, str(ENGINE), *HOSTILE, *extra])
    path.write_text(
        f"schema: 1\nextends: {REPO / 'recipes' / 'tiny.yaml'}\nname: keep\nengine:\n  entrypoint: {entry}\n"
        "serve:\n  health_timeout_s: 30\n"
    )
    return path


def _exec_start(unit: str) -> list[str]:
    """ExecStart as systemd splits it: quoted words, then `$$` and `%%` back to one character."""
    (line,) = [x for x in unit.splitlines() if x.startswith("ExecStart=")]
    return [w.replace("$$", "$").replace("%%", "%") for w in shlex.split(line.removeprefix("ExecStart="))]


def _unit(tmp_path: Path) -> Path:
    return tmp_path / "config" / "systemd" / "user" / "sparkctl-keep.service"


def test_dry_run_renders_the_unit_and_writes_nothing(tmp_path: Path) -> None:
    res = _sparkctl(tmp_path, "up", str(_recipe(tmp_path)), "--persist", "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["systemd_unit"]["path"] == str(_unit(tmp_path))
    assert _exec_start(out["systemd_unit"]["text"]) == out["plan"]["argv"]
    assert not (tmp_path / "config").exists()
    text = _sparkctl(tmp_path, "up", str(_recipe(tmp_path)), "--persist", "--dry-run")
    assert f"# --persist: systemd user unit {_unit(tmp_path)}" in text.stdout
    assert "#   WantedBy=default.target" in text.stdout


def test_a_persisted_native_server_gets_a_unit_that_runs_its_argv_and_down_removes_it(
    tmp_path: Path,
) -> None:
    up = _sparkctl(tmp_path, "up", str(_recipe(tmp_path)), "--persist", "--port", str(free_port()), "--json")
    assert up.returncode == 0, up.stderr
    unit = _unit(tmp_path)
    assert json.loads(up.stdout)["systemd_unit"] == str(unit)
    state = json.loads((tmp_path / "state" / "servers" / "keep.json").read_text())
    text = unit.read_text()
    assert _exec_start(text) == shlex.split(state["extra"]["argv"])  # what runs now runs after a reboot
    assert _exec_start(text)[2 : 2 + len(HOSTILE)] == HOSTILE
    assert f"StandardOutput=append:{state['log_path']}" in text
    assert "Restart=on-failure" in text and "WantedBy=default.target" in text
    link = unit.parent / "default.target.wants" / unit.name
    assert link.is_symlink() and link.resolve() == unit.resolve()  # enabled, as `systemctl --user enable`
    assert [p.name for p in unit.parent.iterdir()] == [unit.name, "default.target.wants"] or sorted(
        p.name for p in unit.parent.iterdir()
    ) == sorted([unit.name, "default.target.wants"])  # no temp file left
    if shutil.which("systemd-analyze"):
        verify = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
        )
        problems = [
            line
            for line in (verify.stdout + verify.stderr).splitlines()
            if unit.name in line
            and "Failed to" not in line  # no bus/manager here: only the file's own faults
        ]
        assert problems == [], verify.stderr
    down = _sparkctl(tmp_path, "down", "keep")
    assert down.returncode == 0, down.stderr
    assert f"removed its systemd unit {unit}" in down.stdout
    assert not unit.exists() and not link.is_symlink()
    assert not (tmp_path / "state" / "servers" / "keep.json").exists()


def test_down_removes_a_unit_whose_server_is_not_running(tmp_path: Path) -> None:
    """After a reboot systemd, not sparkctl, runs it: `down` still finds and removes the unit."""
    up = _sparkctl(tmp_path, "up", str(_recipe(tmp_path)), "--persist", "--port", str(free_port()))
    assert up.returncode == 0, up.stderr
    assert _sparkctl(tmp_path, "down", "keep").returncode == 0
    assert _sparkctl(tmp_path, "down", "keep").stdout.startswith("keep is not running")
    up = _sparkctl(tmp_path, "up", str(_recipe(tmp_path)), "--persist", "--port", str(free_port()))
    state_file = tmp_path / "state" / "servers" / "keep.json"
    pid = json.loads(state_file.read_text())["pid"]
    os.killpg(pid, signal.SIGKILL)  # as after a reboot: the server is not ours, no state of ours
    state_file.unlink()
    down = _sparkctl(tmp_path, "down", "--all")
    assert down.returncode == 0, down.stderr
    assert "removed its systemd unit" in down.stdout and not _unit(tmp_path).exists()


@pytest.mark.parametrize("bad", ["two\nlines", "tab\there"])
def test_a_value_a_unit_cannot_hold_is_refused_before_anything_starts(tmp_path: Path, bad: str) -> None:
    res = _sparkctl(tmp_path, "up", str(_recipe(tmp_path, bad)), "--persist", "--port", str(free_port()))
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: --persist: the command line holds a control character")
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "config").exists() and not (tmp_path / "state" / "servers" / "keep.json").exists()


def test_a_failed_persisted_up_leaves_no_unit(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    recipe.write_text(recipe.read_text().replace("health_timeout_s: 30", "health_timeout_s: 1"))
    recipe.write_text(recipe.read_text().replace(str(ENGINE), str(tmp_path / "missing.py")))
    res = _sparkctl(tmp_path, "up", str(recipe), "--persist", "--port", str(free_port()))
    assert res.returncode == 1, res.stderr
    assert not _unit(tmp_path).exists()
