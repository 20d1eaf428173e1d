"""One real `sparkctl up tiny` (vLLM on the CPU, native runtime) shared by the whole e2e session.

Starting vLLM costs about a minute on 2 cores, so every native end-to-end test talks to this one
server; the module that uses it stops it in its last test and checks nothing is left behind.

The start also takes the Spark's load path: `load.prewarm=always` warms the shards with 8 workers and
`SPARKCTL_UNIFIED_MEMORY=1` makes `up` run the EvictionSteward while vLLM loads and evict once healthy,
exactly as on a GB10, at no extra server start.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from sparkctl_proc import run_in_env

from sparkctl.server.ports import free_port

REPO = Path(__file__).resolve().parents[2]


@dataclass
class TinyServer:
    port: int
    env: dict[str, str]
    state_dir: Path
    up: dict  # `sparkctl up --json` output
    up_stderr: str
    wall_s: float

    def sparkctl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run_in_env(self.env, *args, timeout=timeout)


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory) -> TinyServer:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this Python (make install-vllm)")
    root = tmp_path_factory.mktemp("e2e-native")
    env = {
        **os.environ,
        "SPARKCTL_STATE_DIR": str(root / "state"),
        "SPARKCTL_CACHE_DIR": str(root / "cache"),
        "SPARKCTL_UNIFIED_MEMORY": "1",
    }
    port = free_port()
    t0 = time.monotonic()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkctl",
            "up",
            "tiny",
            "--port",
            str(port),
            "--set",
            "load.prewarm=always",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    wall = time.monotonic() - t0
    server = TinyServer(port, env, root / "state", {}, res.stderr, wall)
    try:
        assert res.returncode == 0, f"sparkctl up tiny failed:\n{res.stderr}"
        server.up = json.loads(res.stdout)
        yield server
    finally:
        # Whatever the tests did, leave no server behind (down is idempotent).
        server.sparkctl("down", "--all", timeout=120)
