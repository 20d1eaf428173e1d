"""A damaged state file never hides a running server, and never turns into a traceback.

A real `up` (the stand-in engine, tests/safety/fake_engine.py) runs; then its state file is overwritten
with garbage, a truncated record, JSON of the wrong shape, or deleted. `status` must still show the
server (found by the marker in its processes' environment), and `down` / `down --all` must stop it and
set the bad file aside. Wrong-shaped records are one line in `status`, `logs`, `chat` and `up`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from procs import gone
from sparkctl_proc import run_sparkctl

from sparkctl.server.ports import free_port

pytestmark = pytest.mark.slow  # starts local processes (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).with_name("fake_engine.py")

DAMAGE = {
    "garbage": "\x00\x01not json at all",
    "truncated": '{"recipe": "hurt", "runtime": "nat',
    "a list": "[1, 2, 3]",
    "wrong types": json.dumps(
        {
            "recipe": "hurt",
            "runtime": "native",
            "recipe_hash": 1,
            "base_url": [],
            "port": "x",
            "served_model_name": "hurt",
            "started_at": "yesterday",
            "pid": "1",
            "extra": [],
        }
    ),
    "deleted": None,
}


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Path, list[psutil.Process]]]:
    recipe = tmp_path / "hurt.yaml"
    recipe.write_text(
        f"schema: 1\nextends: {REPO / 'recipes' / 'tiny.yaml'}\nname: hurt\n"
        f"engine:\n  entrypoint: {json.dumps([sys.executable, str(FAKE)])}\nserve:\n  health_timeout_s: 60\n"
    )
    up = run_sparkctl(tmp_path, "up", str(recipe), "--port", str(free_port()), "--no-smoke")
    assert up.returncode == 0, up.stderr
    record = json.loads((tmp_path / "state" / "servers" / "hurt.json").read_text())
    procs = [psutil.Process(record["pid"])]
    try:
        yield recipe, procs
    finally:
        for p in procs:
            if p.is_running():
                p.kill()


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_status_finds_and_down_stops_a_server_whose_state_file_was_damaged(
    tmp_path: Path, running: tuple[Path, list[psutil.Process]], damage: str
) -> None:
    _, procs = running
    path = tmp_path / "state" / "servers" / "hurt.json"
    if DAMAGE[damage] is None:
        path.unlink()
    else:
        path.write_text(DAMAGE[damage])
    status = run_sparkctl(tmp_path, "status", "--json")
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    rows = json.loads(status.stdout)
    assert [(r["recipe"], r["health"], r["pid"]) for r in rows] == [("hurt", "healthy", procs[0].pid)]
    assert "found by its process marker" in status.stderr
    if DAMAGE[damage] is not None:
        assert f"state file {path} is damaged" in status.stderr
    down = run_sparkctl(tmp_path, "down", "--all")
    assert down.returncode == 0, down.stderr
    assert gone(procs[0].pid)
    assert not path.exists()
    assert json.loads(run_sparkctl(tmp_path, "status", "--json").stdout) == []


@pytest.mark.parametrize("damage", ["garbage", "a list", "wrong types"])
def test_a_bad_record_is_one_line_in_every_command(
    tmp_path: Path, running: tuple[Path, list[psutil.Process]], damage: str
) -> None:
    recipe, procs = running
    path = tmp_path / "state" / "servers" / "hurt.json"
    path.write_text(DAMAGE[damage])
    for args in (["logs", "hurt"], ["chat", "hurt", "-m", "hi"], ["up", str(recipe)], ["status", "hurt"]):
        res = run_sparkctl(tmp_path, *args)
        assert "Traceback" not in res.stderr, (args, res.stderr)
        if args[0] != "status":
            errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
            assert res.returncode != 0 and len(errors) == 1, (args, res.stderr)
            assert errors[0].startswith("error: state file "), (args, res.stderr)
    down = run_sparkctl(tmp_path, "down", "hurt")
    assert down.returncode == 0 and "set aside" in down.stdout, down.stdout + down.stderr
    assert gone(procs[0].pid)
    assert (path.parent / "hurt.json.damaged").read_text() == DAMAGE[damage]


def test_another_state_directorys_servers_are_not_found_by_marker(
    tmp_path: Path, running: tuple[Path, list[psutil.Process]]
) -> None:
    """The hole the marker scan opened: `down --all` of a second state (a test's, another install) killed
    the servers of the first one. Markers carry their state directory."""
    from sparkctl_proc import run_in_env, sparkctl_env

    _, procs = running
    (tmp_path / "state" / "servers" / "hurt.json").unlink()  # not even a record left in its own state
    other = sparkctl_env(tmp_path / "other")
    status = run_in_env(other, "status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout) == [], status.stdout
    down = run_in_env(other, "down", "--all")
    assert down.returncode == 0 and "hurt" not in down.stdout + down.stderr
    assert procs[0].is_running() and procs[0].status() != psutil.STATUS_ZOMBIE
    assert run_sparkctl(tmp_path, "down", "--all").returncode == 0  # its own state still finds it
    assert gone(procs[0].pid)


def test_a_forged_record_cannot_restyle_or_rewrite_the_terminal(tmp_path: Path) -> None:
    """Values from a record (or a file name in the state directory) are shown escaped in `status`."""
    servers = tmp_path / "state" / "servers"
    servers.mkdir(parents=True)
    evil = "\x1b[2J\x1b]0;pwned\x07evil[bold red]x"
    record = {
        "recipe": evil,
        "runtime": "native",
        "recipe_hash": "",
        "base_url": "http://127.0.0.1:1\r",
        "port": 1,
        "served_model_name": "m",
        "started_at": 0,
        "pid": None,
        "extra": {},
    }
    from sparkctl.paths import file_stem

    (servers / f"{file_stem(evil)}.json").write_text(json.dumps(record))
    (servers / "bad\x1b[31m.json").write_text("{")
    res = run_sparkctl(tmp_path, "status")
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out, repr(out)
    assert "evil[bold red]x" in res.stdout  # markup shown as text, not obeyed
    down = run_sparkctl(tmp_path, "down", "--all")
    assert down.returncode == 0, down.stderr
    assert "\x1b" not in down.stdout + down.stderr and "stopped \\x1b[2J" in down.stdout, repr(down.stdout)
    assert "bad\\x1b[31m (its state file was damaged" in down.stdout, repr(down.stdout)
    assert sorted(p.name for p in servers.iterdir()) == ["bad\x1b[31m.json.damaged"]
