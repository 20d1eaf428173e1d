"""API keys and exposure (issue 27): a key reaches the engine and sparkctl's own calls, and nowhere else.

The engine is a small python OpenAI server given as the recipe's `engine.entrypoint`: it takes its key
the way vLLM does (VLLM_API_KEY in its environment) and answers 401 on /v1/* without it, so `up`'s
health gate, smoke test and `chat` pass only if they send it. Every output, log, state and rendered file
is then searched for the key.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sparkctl_proc import run_sparkctl

from sparkctl.server.ports import free_port

# starts processes (tests/conftest.py, the process guard): not in make test-fast
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
HF_TOKEN = "hf_PlantedHubTokenForTheLeakTest0123"

_ENGINE = """
    import http.server, json, os, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    name = sys.argv[sys.argv.index("--served-model-name") + 1]
    key = os.environ.get("VLLM_API_KEY")
    print("engine up; key given:", bool(key), "argv:", " ".join(sys.argv), flush=True)

    class Handler(http.server.BaseHTTPRequestHandler):
        def _authorised(self):
            if self.path.startswith("/v1/") and key and self.headers.get("Authorization") != "Bearer " + key:
                self.send_response(401)
                self.end_headers()
                self.wfile.write(b'{"error": {"message": "invalid api key"}}')
                return False
            return True

        def do_GET(self):
            if not self._authorised():
                return
            self.send_response(200)
            self.end_headers()
            if self.path.startswith("/v1/models"):
                self.wfile.write(json.dumps({"data": [{"id": name}]}).encode())

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if not self._authorised():
                return
            self.send_response(200)
            self.end_headers()
            if body.get("stream"):
                chunk = {"choices": [{"delta": {"content": "hello"}}]}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\\n\\ndata: [DONE]\\n\\n")
            else:
                reply = {"choices": [{"message": {"content": "hello"}, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
                self.wfile.write(json.dumps(reply).encode())

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def _recipe(tmp_path: Path, name: str, extra: str = "") -> Path:
    entry = json.dumps([sys.executable, "-c", textwrap.dedent(_ENGINE)])
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"schema: 1\nextends: {REPO / 'recipes' / 'tiny.yaml'}\nname: {name}\n"
        f"engine:\n  entrypoint: {entry}\nserve:\n  health_timeout_s: 60\n{extra}"
    )
    return path


def _sparkctl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # HF_TOKEN planted: the engine may read it, no output, log, state or render may show it
    return run_sparkctl(tmp_path, *args, HF_TOKEN=HF_TOKEN)


def _everything_written(tmp_path: Path, *results: subprocess.CompletedProcess[str]) -> str:
    """Every output of the commands and every file under the state dir except the key file itself."""
    texts = [r.stdout + r.stderr for r in results]
    for path in (tmp_path / "state").rglob("*"):
        if path.is_file() and path.parent.name != "keys":
            texts.append(path.read_text(errors="replace"))
    return "\n".join(texts)


def test_a_generated_key_is_printed_once_stored_0600_and_used_by_sparkctls_own_calls(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "keyed")
    try:
        up = _sparkctl(tmp_path, "up", str(recipe), "--port", str(free_port()), "--api-key", "generate")
        assert up.returncode == 0, up.stderr  # health (/v1/models) and smoke (chat) passed with the key
        key_file = tmp_path / "state" / "keys" / "keyed.env"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
        var, _, key = key_file.read_text().strip().partition("=")
        assert var == "VLLM_API_KEY" and len(key) >= 32
        assert up.stdout.count(key) == 1  # printed once
        log = (tmp_path / "state" / "logs" / "keyed.log").read_text()
        assert "key given: True" in log  # the engine got it from its environment

        chat = _sparkctl(tmp_path, "chat", "keyed", "-m", "hi")
        assert chat.returncode == 0, chat.stderr
        assert chat.stdout.strip() == "hello"
        render = _sparkctl(tmp_path, "render", str(recipe), "--format", "shell")
        assert render.returncode == 0 and str(key_file) in render.stdout
        status = _sparkctl(tmp_path, "status", "--json")
        again = _sparkctl(tmp_path, "up", str(recipe))  # already up: reported, the key not shown again
        assert again.returncode == 0, again.stderr
        leaked = _everything_written(tmp_path, up, chat, render, status, again).replace(key, "", 1)
        assert key not in leaked and HF_TOKEN not in leaked
    finally:
        _sparkctl(tmp_path, "down", "keyed")


def test_a_planted_key_file_reaches_the_engine_but_no_output_log_state_or_render(tmp_path: Path) -> None:
    planted = "sk-planted-" + "Z" * 24
    key_src = tmp_path / "my.key"
    key_src.write_text(planted + "\n")
    recipe = _recipe(tmp_path, "planted", extra=f"  api_key_file: {key_src}\n")
    try:
        up = _sparkctl(tmp_path, "up", str(recipe), "--port", str(free_port()))
        assert up.returncode == 0, up.stderr
        renders = [_sparkctl(tmp_path, "render", str(recipe), "--format", f) for f in ("shell", "json")]
        renders.append(
            _sparkctl(
                tmp_path,
                "render",
                str(recipe),
                "--format",
                "compose",
                "--set",
                "runtime=docker",
                "--set",
                "container.image=img",
            )
        )
        assert all(r.returncode == 0 for r in renders), [r.stderr for r in renders]
        compose = renders[-1].stdout
        assert "env_file:" in compose and str(tmp_path / "state" / "keys" / "planted.env") in compose
        chat = _sparkctl(tmp_path, "chat", "planted", "-m", "hi")
        assert chat.returncode == 0, chat.stderr
        leaked = _everything_written(tmp_path, up, chat, *renders)
        assert planted not in leaked and HF_TOKEN not in leaked
    finally:
        _sparkctl(tmp_path, "down", "planted")


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["--expose"], 2, "would listen on 0.0.0.0:"),
        (["--set", "serve.host=192.168.1.2"], 2, "with no API key: anyone who can reach this machine"),
        (["--expose", "--no-auth"], 0, ""),
        (["--expose", "--api-key", "generate"], 0, ""),
        (["--api-key", "sk-" + "k" * 30], 2, "--api-key KEY would put the key in this command line"),
        (
            ["--set", "serve.extra_args=[--api-key, sk-xxxxxxxxxxxxxxxxxxxx]"],
            2,
            "serve.extra_args: --api-key here",
        ),
    ],
)
def test_exposure_needs_a_key_or_no_auth(tmp_path: Path, args: list[str], code: int, fragment: str) -> None:
    res = _sparkctl(tmp_path, "up", str(_recipe(tmp_path, "exposed")), "--dry-run", *args)
    assert res.returncode == code, res.stderr
    if code:
        first, *rest = res.stderr.splitlines()
        assert first.startswith("error: ") and fragment in first, res.stderr
        assert all(line.startswith("hint: ") for line in rest)
    assert "sk-xxxxxxxx" not in res.stdout + res.stderr or "extra_args" in fragment
    assert not (tmp_path / "state" / "keys").exists()  # a dry run stores nothing


def _argv_holding(secret: str) -> list[str]:
    """Every process on this machine whose command line holds `secret` (what `ps` shows any user)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(secret in word for word in proc.info["cmdline"] or ()):
            found.append(" ".join(proc.info["cmdline"]))
    return found


@pytest.mark.parametrize("how", ["env", "stdin"])
def test_a_key_given_by_env_or_stdin_is_in_no_processs_argv_while_up_runs(tmp_path: Path, how: str) -> None:
    """The hole: `up --api-key KEY` showed the key in `ps` for the whole start-up. A literal key is refused
    (above); the key comes from SPARKCTL_API_KEY or stdin, and neither sparkctl's nor the engine's argv has it."""
    import time

    from sparkctl_proc import sparkctl_env

    key = "sk-from-" + how + "-" + "Q" * 24
    recipe = _recipe(tmp_path, "quiet").read_text()
    # a slow start, so `ps` is read while `up` is still waiting for health
    recipe = recipe.replace(
        "import http.server, json, os, sys", "import http.server, json, os, sys, time; time.sleep(3)"
    )
    path = tmp_path / "quiet.yaml"
    path.write_text(recipe)
    env = sparkctl_env(tmp_path, **({"SPARKCTL_API_KEY": key} if how == "env" else {}))
    args = ["up", str(path), "--port", str(free_port())] + (["--api-key", "-"] if how == "stdin" else [])
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkctl", *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(key + "\n")
        proc.stdin.close()
        seen: list[str] = []
        while proc.poll() is None:
            seen += _argv_holding(key)
            time.sleep(0.2)
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()
        assert proc.returncode == 0, err
        assert seen == [] and _argv_holding(key) == []
        assert key not in out + err
        log = (tmp_path / "state" / "logs" / "quiet.log").read_text()
        assert "key given: True" in log and key not in log
        assert (tmp_path / "state" / "keys" / "quiet.env").read_text().strip() == f"VLLM_API_KEY={key}"
        chat = _sparkctl(tmp_path, "chat", "quiet", "-m", "hi")  # sparkctl's own calls use the stored key
        assert chat.returncode == 0, chat.stderr
    finally:
        proc.kill() if proc.poll() is None else None
        _sparkctl(tmp_path, "down", "quiet")


def test_expose_without_auth_is_said_loudly(tmp_path: Path) -> None:
    res = _sparkctl(tmp_path, "up", str(_recipe(tmp_path, "open")), "--dry-run", "--expose", "--no-auth")
    assert res.returncode == 0, res.stderr
    assert "OPEN TO THE NETWORK" in res.stderr and "NO API key" in res.stderr
    quiet = _sparkctl(tmp_path, "up", str(_recipe(tmp_path, "open")), "--dry-run", "--no-auth")
    assert "OPEN TO THE NETWORK" not in quiet.stderr  # loopback: nothing to shout about


def test_bench_warns_about_a_key_on_its_command_line_and_reads_one_from_stdin(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: bench stops at its first request
    key = "sk-bench-" + "B" * 24
    argv = _sparkctl(tmp_path, "bench", "run", "--url", url, "--model", "m", "--api-key", key, "--no-html")
    assert "visible to every local user" in argv.stderr and key not in argv.stdout + argv.stderr
    env_given = run_sparkctl(
        tmp_path, "bench", "run", "--url", url, "--model", "m", "--no-html", OPENAI_API_KEY=key
    )
    assert "visible to every local user" not in env_given.stderr
    from sparkctl_proc import sparkctl_env

    piped = subprocess.run(
        [sys.executable, "-m", "sparkctl", "bench", "run", "--url", url, "--model", "m", "--api-key", "-"],
        input=key + "\n",
        env=sparkctl_env(tmp_path),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert "visible to every local user" not in piped.stderr and "stdin gave no key" not in piped.stderr
    assert piped.returncode == argv.returncode != 0, (
        piped.stderr
    )  # the same connection error, not a key error
