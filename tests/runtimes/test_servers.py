"""sparkctl.servers, called directly (not through click): the records `status`, `down`, `logs` and `chat`
render, against a real server process recorded in a real state file."""

from __future__ import annotations

import sys
import time

import httpx
import pytest

from sparkctl import servers
from sparkctl.errors import UserError
from sparkctl.runtimes import state as state_files
from sparkctl.runtimes.native import NativeRuntime
from sparkctl.server.ports import free_port

# A stand-in engine: answers 200 on every path (so /health), and says so in its log.
HEALTHY = """
import http.server, sys
port = int(sys.argv[1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
print("serving", port, flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _wait(pred, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_recorded_server_through_its_life(make_plan) -> None:
    port = free_port()
    plan = make_plan(argv=[sys.executable, "-c", HEALTHY, str(port)], name="srv", port=port)
    st = NativeRuntime().start(plan, state_files.log_path("srv"))
    state_files.save(st)
    try:
        _wait(lambda: _answers(st.base_url))
        (row,) = servers.status_rows()
        assert row["recipe"] == "srv" and row["health"] == "healthy" and row["port"] == port
        assert row["memory_bytes"] > 1_000_000 and row["error"] is None
        assert servers.status_rows("other") == []
        assert servers.find_state("srv") == st
        assert servers.chat_target(None) == st  # the only one running
        assert servers.to_stop("srv", False) == [st]
        assert servers.to_stop(None, True) == [st]
        servers.stop(st, timeout_s=10)
    finally:
        NativeRuntime().stop(st, timeout_s=10)
    assert servers.find_state("srv") is None and servers.status_rows() == []
    assert any("serving" in line for line in servers.log_lines("srv"))  # the log outlives the server
    servers.known_recipe("srv")  # it ran here: stopping it again is fine, not a typo


def _answers(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_a_stopped_server_is_a_record_not_an_error(make_plan) -> None:
    plan = make_plan("pass", name="gone")
    st = NativeRuntime().start(plan, state_files.log_path("gone"))
    state_files.save(st)
    _wait(lambda: not NativeRuntime().is_running(st))
    (row,) = servers.status_rows("gone")
    assert row["health"] == "stopped" and row["memory_bytes"] is None
    with pytest.raises(UserError, match="gone is not running: its server stopped"):
        servers.chat_target("gone")


def test_names_that_never_ran() -> None:
    assert servers.to_stop("tiny", False) == []  # a built-in recipe that is not running
    with pytest.raises(UserError, match="tiyn"):
        servers.to_stop("tiyn", False)  # a typo is not "stopped"
    with pytest.raises(UserError, match="name the recipe to chat with \\(running: none\\)"):
        servers.chat_target(None)
    with pytest.raises(UserError, match="no logs for tiny"):
        servers.log_lines("tiny")
    with pytest.raises(UserError, match="not both"):
        servers.to_stop("tiny", True)
