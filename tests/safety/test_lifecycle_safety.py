"""`down` during a starting `up`, and engine processes that outlive their API server (issue 27).

Real CLI processes, real engine processes: the engine is a small python program given as the recipe's
`engine.entrypoint` (as in tests/runtimes/test_up_failures.py), so each case takes seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from ctrl_c import sigint_default
from procs import gone
from sparkctl_proc import engine_recipe
from sparkctl_proc import run_sparkctl as _sparkctl
from sparkctl_proc import sparkctl_env as _env

from sparkctl.server.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def _recipe(tmp_path: Path, name: str, engine_code: str, *, health_timeout: float = 60) -> Path:
    return engine_recipe(tmp_path, name, engine_code, health_timeout=health_timeout)


@contextlib.contextmanager
def _up(tmp_path: Path, recipe: Path, *extra: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkctl", "up", str(recipe), "--port", str(free_port()), *extra],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        preexec_fn=sigint_default,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _wait_for(cond, timeout: float = 60, what: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _lock_held_by_up(tmp_path: Path, name: str) -> bool:
    lock = tmp_path / "state" / "locks" / f"{name}.lock"
    try:
        return lock.read_text().strip().endswith(" up")
    except OSError:
        return False


def _marked(marker: str) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "status"])
        if marker in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


def _never_healthy(tmp_path: Path, name: str) -> tuple[Path, str]:
    marker = f"{name}-{os.getpid()}-{time.monotonic_ns()}"
    return _recipe(tmp_path, name, f"import time  # {marker}\ntime.sleep(600)\n", health_timeout=300), marker


@pytest.mark.slow
def test_down_while_up_is_starting_before_the_launch_stops_it(tmp_path: Path) -> None:
    """The hole: `down` 0.1 s into an `up` said "not running" (exit 0), then `up` left a server running."""
    recipe, marker = _never_healthy(tmp_path, "early")
    state_file = tmp_path / "state" / "servers" / "early.json"
    with _up(tmp_path, recipe) as up:
        _wait_for(lambda: _lock_held_by_up(tmp_path, "early"), what="up to take the lock")
        launched_before_down = state_file.exists()
        down = _sparkctl(tmp_path, "down", "early")
        assert down.returncode == 0, down.stderr
        assert "not running" not in down.stdout
        assert down.stdout.startswith("stopped early (it was still starting: interrupted its `up` (pid "), (
            down.stdout,
            launched_before_down,
        )
        _, up_err = up.communicate(timeout=60)
        assert up.returncode == 130, up_err
    assert not state_file.exists()
    time.sleep(0.2)
    assert _marked(marker) == []


@pytest.mark.slow
def test_down_while_up_waits_for_health_stops_the_server(tmp_path: Path) -> None:
    recipe, marker = _never_healthy(tmp_path, "waiting")
    state_file = tmp_path / "state" / "servers" / "waiting.json"
    with _up(tmp_path, recipe) as up:
        _wait_for(state_file.exists, what="the launch")
        pid = json.loads(state_file.read_text())["pid"]
        down = _sparkctl(tmp_path, "down", "waiting")
        assert down.returncode == 0, down.stderr
        assert "interrupted its `up`" in down.stdout
        up.communicate(timeout=60)
        assert up.returncode == 130
    assert gone(pid) and not state_file.exists()
    time.sleep(0.2)
    assert _marked(marker) == []


@pytest.mark.slow
def test_up_while_down_holds_the_lock_is_refused_with_a_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparkctl.runtimes import state as state_files

    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(tmp_path / "state"))
    recipe, _ = _never_healthy(tmp_path, "held")
    with state_files.stopping("held") as interrupted:
        assert interrupted is None
        up = _sparkctl(tmp_path, "up", str(recipe))
    assert up.returncode == 1
    assert "error: `sparkctl down held` is stopping it right now" in up.stderr
    assert "Traceback" not in up.stderr


# -- orphans ------------------------------------------------------------------------------------------

# An API server that forks an "engine core" first: the child maps a /dev/shm/psm_* segment (as vLLM's
# engine and workers do) and lives on when the API server is SIGKILLed.
_ENGINE_WITH_CORE = """
    import http.server, json, mmap, os, sys, time
    marker = {marker!r}
    port = int(sys.argv[sys.argv.index("--port") + 1])
    name = sys.argv[sys.argv.index("--served-model-name") + 1]
    if os.fork() == 0:
        fd = os.open("/dev/shm/psm_" + marker, os.O_CREAT | os.O_RDWR, 0o600)
        os.ftruncate(fd, 1 << 20)
        seg = mmap.mmap(fd, 1 << 20)
        seg[:] = b"x" * (1 << 20)
        time.sleep(600)
        os._exit(0)
    models = json.dumps({{"object": "list", "data": [{{"id": name, "object": "model"}}]}}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(models if self.path.startswith("/v1/models") else b"")

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.mark.slow
def test_engine_processes_outliving_the_api_server_are_orphaned_and_reaped(tmp_path: Path) -> None:
    """The hole: SIGKILL of the API server left the engine core and /dev/shm/psm_* segments alive, and
    `status` said `stopped` while they held memory."""
    marker = f"orph{os.getpid()}{time.monotonic_ns()}"
    segment = Path("/dev/shm") / f"psm_{marker}"
    recipe = _recipe(tmp_path, "orph", _ENGINE_WITH_CORE.format(marker=marker))
    try:
        with _up(tmp_path, recipe, "--no-smoke") as up:
            out, err = up.communicate(timeout=120)
            assert up.returncode == 0, err
        state = json.loads((tmp_path / "state" / "servers" / "orph.json").read_text())
        _wait_for(segment.exists, 10, "the engine core's segment")
        api = psutil.Process(state["pid"])
        (core,) = api.children()
        os.kill(api.pid, signal.SIGKILL)
        _wait_for(lambda: gone(api.pid), 10, "the API server to die")

        status = _sparkctl(tmp_path, "status", "orph", "--json")
        assert status.returncode == 0, status.stderr
        (row,) = json.loads(status.stdout)
        assert row["health"] == "orphaned"
        assert row["memory_bytes"] and row["memory_bytes"] > 0
        assert core.is_running()

        down = _sparkctl(tmp_path, "down", "orph")
        assert down.returncode == 0, down.stderr
        assert "reaped 1 orphaned engine process(es)" in down.stdout
        _wait_for(lambda: gone(core.pid), 10, "the engine core to be reaped")
        assert not segment.exists()
        assert not (tmp_path / "state" / "servers" / "orph.json").exists()
    finally:
        for pid in _marked(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        segment.unlink(missing_ok=True)


def test_a_persisted_plan_renders_with_its_restart_policy() -> None:
    import dataclasses

    from sparkctl.planner.render import render
    from sparkctl.plans import load_and_plan

    _, p = load_and_plan("glm-5.3-flash", check_memory=False)
    p = dataclasses.replace(p, container=dataclasses.replace(p.container, restart_policy="unless-stopped"))
    shell = render(p, "shell")
    assert shell.splitlines()[1].startswith("docker run -d --restart unless-stopped") and "--rm" not in shell
    assert "restart: unless-stopped" in render(p, "compose")


def _model_dir(tmp_path: Path) -> Path:
    import struct

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    header = b'{"w":{"dtype":"U8","shape":[4096],"data_offsets":[0,4096]}}'
    header += b" " * (-len(header) % 8)
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4096)
    return model


def _path_recipe(tmp_path: Path, model: Path, marker: str) -> Path:
    path = tmp_path / "shard.yaml"
    entry = json.dumps([sys.executable, "-c", f"import time  # {marker}\ntime.sleep(600)\n"])
    path.write_text(
        f"schema: 1\nextends: {REPO / 'recipes' / 'tiny.yaml'}\nname: shard\n"
        f"model:\n  generate: null\n  path: {model}\nengine:\n  entrypoint: {entry}\n"
        "serve:\n  health_timeout_s: 60\n"
    )
    return path


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["truncated", "deleted"])
def test_a_broken_shard_is_one_line_before_anything_is_launched(tmp_path: Path, fault: str) -> None:
    model = _model_dir(tmp_path)
    shard = model / "model.safetensors"
    if fault == "truncated":
        os.truncate(shard, shard.stat().st_size - 100)
    else:  # one of two shards gone, the index still names it: an interrupted download
        os.link(shard, model / "model-2.safetensors")
        (model / "model.safetensors.index.json").write_text(
            '{"weight_map": {"a": "model.safetensors", "b": "model-2.safetensors"}}'
        )
        (model / "model-2.safetensors").unlink()
    marker = f"shard-{os.getpid()}-{time.monotonic_ns()}"
    res = _sparkctl(tmp_path, "up", str(_path_recipe(tmp_path, model, marker)), "--port", str(free_port()))
    assert res.returncode in (1, 2), res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in res.stderr
    assert (
        "truncated, 4068 bytes but its header says 4168" if fault == "truncated" else "missing"
    ) in errors[0]
    assert "re-download" in res.stderr or "fetch the model again" in res.stderr
    assert not (tmp_path / "state" / "logs" / "shard.log").exists()  # nothing was launched
    assert _marked(marker) == []


@pytest.mark.slow
def test_the_api_server_killed_during_load_is_reported_and_its_engine_reaped(tmp_path: Path) -> None:
    """kill -9 of the API server alone while `up` waits: the engine core it forked must not live on."""
    marker = f"load{os.getpid()}{time.monotonic_ns()}"
    code = f"import os, time  # {marker}\nif os.fork() == 0:\n    time.sleep(600)\ntime.sleep(600)\n"
    recipe = _recipe(tmp_path, "load", code, health_timeout=120)
    state_file = tmp_path / "state" / "servers" / "load.json"
    with _up(tmp_path, recipe) as up:
        _wait_for(state_file.exists, what="the launch")
        api = psutil.Process(json.loads(state_file.read_text())["pid"])
        _wait_for(lambda: len(api.children()) == 1, 10, "the engine core")
        (core,) = api.children()
        os.kill(api.pid, signal.SIGKILL)
        _, err = up.communicate(timeout=60)
    assert up.returncode == 1, err
    assert "error: load stopped during start-up after" in err and "killed by SIGKILL" in err
    _wait_for(lambda: gone(core.pid), 10, "the orphaned engine core to be reaped")
    assert not state_file.exists() and _marked(marker) == []


@pytest.mark.slow
def test_ctrl_c_before_the_launch_leaves_no_state_and_no_half_made_model(tmp_path: Path) -> None:
    """Ctrl-C as soon as `up` holds the lock: in the doctor or while `tiny`'s model is being made."""
    recipe, marker = _never_healthy(tmp_path, "early-int")
    with _up(tmp_path, recipe) as up:
        _wait_for(lambda: _lock_held_by_up(tmp_path, "early-int"), what="up to take the lock")
        up.send_signal(signal.SIGINT)
        _, err = up.communicate(timeout=60)
    # 130 from sparkctl; once in ~8 runs (Ctrl-C inside the doctor's probe threads) the interpreter ends by
    # SIGINT itself after the clean-up message: the same outcome for a shell, cause not found yet
    assert up.returncode in (130, -signal.SIGINT), err
    assert "interrupted: stopped what this `up` had started" in err and "Traceback" not in err
    assert not (tmp_path / "state" / "servers" / "early-int.json").exists()
    models = tmp_path / "cache" / "models"
    leftovers = [p.name for p in models.iterdir()] if models.exists() else []
    assert all(name == "tiny-llama" for name in leftovers), leftovers  # done, or not there: never a temp dir
    time.sleep(0.2)
    assert _marked(marker) == []
