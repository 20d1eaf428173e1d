"""memory.watchdog: below the MemAvailable floor the server is stopped cleanly and the log says why."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from procs import gone
from sparkctl_proc import run_sparkctl as _sparkctl

from sparkctl.server.ports import free_port

# starts processes (tests/conftest.py, the process guard): not in make test-fast
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
_ENGINE = """
    import http.server, json, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    name = sys.argv[sys.argv.index("--served-model-name") + 1]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            if self.path.startswith("/v1/models"):
                self.wfile.write(json.dumps({"data": [{"id": name}]}).encode())

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def _up(tmp_path: Path, floor: int) -> dict:
    entry = json.dumps([sys.executable, "-c", textwrap.dedent(_ENGINE)])
    recipe = tmp_path / "wd.yaml"
    recipe.write_text(
        f"schema: 1\nextends: {REPO / 'recipes' / 'tiny.yaml'}\nname: wd\nengine:\n  entrypoint: {entry}\n"
        f"memory:\n  watchdog: {{floor_bytes: {floor}, interval_s: 0.2}}\n"
    )
    up = _sparkctl(tmp_path, "up", str(recipe), "--port", str(free_port()), "--no-smoke", "--json")
    assert up.returncode == 0, up.stderr
    assert "watchdog stops the server if MemAvailable falls below" in " ".join(up.stderr.split())
    return json.loads(up.stdout)


def _watchdogs_of(tmp_path: Path) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if "sparkctl.watchdog" in cmd and str(tmp_path) in proc.environ().get("SPARKCTL_STATE_DIR", ""):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def _wait(cond, timeout: float = 15) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_below_the_floor_the_server_is_stopped_and_the_log_says_why(tmp_path: Path) -> None:
    state = _up(tmp_path, floor=psutil.virtual_memory().total * 4)  # always below: trips at once
    assert _wait(lambda: gone(state["pid"])), "the watchdog did not stop the server"
    assert _wait(lambda: not (tmp_path / "state" / "servers" / "wd.json").exists())
    log = (tmp_path / "state" / "logs" / "wd.log").read_text()
    assert "# sparkctl watchdog: MemAvailable" in log and "is below the floor" in log
    assert _wait(lambda: _watchdogs_of(tmp_path) == []), "the watchdog did not end"


def test_above_the_floor_it_only_watches_and_down_ends_it(tmp_path: Path) -> None:
    state = _up(tmp_path, floor=1)
    dog = int(json.loads((tmp_path / "state" / "servers" / "wd.json").read_text())["extra"]["watchdog_pid"])
    time.sleep(1.0)
    assert not gone(state["pid"]) and not gone(dog)
    down = _sparkctl(tmp_path, "down", "wd")
    assert down.returncode == 0, down.stderr
    assert _wait(lambda: gone(dog)) and gone(state["pid"])
