"""`sparkctl cluster check` and `sparkctl up --nodes ... --dry-run` as real processes: a worker behind a
real sshd (127.0.0.2), both nodes' files read from a Spark-like tree; one `error:` line and exit 2 for bad
input, 1 for a node that fails, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_sysfs import spark
from sshd import Sshd, sshd_missing, start_sshd

from sparkctl.cluster.netenv import UNPROBED

REPO = Path(__file__).resolve().parents[2]
GLM = "glm-5.3-flash-4bpw-2x"
ON_LO = ["--set", "cluster.interface=lo", "--set", "cluster.ib_hca=[]"]  # the tree's netdev is `lo`
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(sshd_missing()), reason=sshd_missing() or "")]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    server = start_sshd(tmp_path_factory.mktemp("sshd"), address="127.0.0.2")
    yield server
    server.stop()


@pytest.fixture()
def env(sshd: Sshd, tmp_path: Path) -> dict[str, str]:
    e = dict(os.environ)
    e["SPARKCTL_SSH_OPTS"] = sshd.opts()
    e["SPARKCTL_SYSROOT"] = str(spark(tmp_path / "tree"))
    e["PYTHONPATH"] = f"{REPO}:{REPO / 'kernels'}"
    return e


def sparkctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkctl", *args], env=env, capture_output=True, text=True, timeout=120
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_cluster_check_both_nodes_in_one_table(env: dict[str, str], sshd: Sshd) -> None:
    worker = f"root@127.0.0.2:{sshd.port}"
    proc = sparkctl(env, "cluster", "check", "--nodes", f"localhost,{worker}", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and report["nodes"] == ["localhost", worker]
    assert {f["node"] for f in report["findings"]} == {"localhost", worker, "all"}
    assert report["env"][worker]["NCCL_IB_HCA"] == "roceP2p1s0f1,rocep1s0f1"
    table = sparkctl(env, "cluster", "check", "--nodes", f"localhost,{worker}")
    assert table.returncode == 0 and f"env {worker}: NCCL_SOCKET_IFNAME=lo" in table.stdout


def test_cluster_check_a_zero_gid_fails_with_its_fix(env: dict[str, str], sshd: Sshd) -> None:
    nodes = f"localhost,root@127.0.0.2:{sshd.port}"
    proc = sparkctl(env, "cluster", "check", GLM, "--nodes", nodes, *ON_LO, "--set", "cluster.ib_gid_index=5")
    assert proc.returncode == 1
    assert "GID index 5 is all-zero" in proc.stdout and "ib_gid_index=null" in proc.stdout


def test_up_dry_run_prints_each_node(env: dict[str, str], sshd: Sshd) -> None:
    worker = f"root@127.0.0.2:{sshd.port}"
    absent = ["--set", "container.image=sparkctl-test:no-such-tag"]
    proc = sparkctl(env, "up", GLM, "--nodes", f"localhost,{worker}", "--dry-run", *ON_LO, *absent)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"# env on {worker} (computed on that node):" in out
    assert f"# [2] on {worker} (worker): Ray worker (lo 127.0.0.1)" in out
    assert (
        "--address=127.0.0.1:6379" in out
        and "docker exec sparkctl-ray-glm-5.3-flash-4bpw-2x vllm serve" in out
    )
    assert "# dry run: nothing was started" in out
    # the checks that do not stop a dry run are shown as warnings (the image is not on this machine)
    assert "image sparkctl-test:no-such-tag not on this node" in proc.stderr


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["--nodes", "localhost"], 2, "is for cluster.nodes=2, --nodes names 1"),
        (["--nodes", "localhost,localhost"], 2, "listed twice"),
        (
            ["--nodes", "localhost,{worker}", "--set", "cluster.interface=enp9s0"],
            2,
            "interface enp9s0 not on this node",
        ),
        ([], 2, "name them with --nodes HEAD,WORKER"),
    ],
)
def test_up_nodes_failures_are_one_line(
    env: dict[str, str], sshd: Sshd, args: list[str], code: int, text: str
) -> None:
    args = [a.replace("{worker}", f"root@127.0.0.2:{sshd.port}") for a in args]
    if not args:  # a real start without nodes: the recipe names none
        proc = sparkctl(env, "up", GLM, "--nodes", "", "--dry-run")
    else:
        proc = sparkctl(env, "up", GLM, *args, "--dry-run")
    assert proc.returncode == code, proc.stderr
    assert text in one_error_line(proc)


@pytest.mark.parametrize(
    ("worker", "why"),
    [("127.0.0.2:1", "unreachable over SSH"), ("root@127.0.0.2:{port}", "SSH refused the login")],
)
def test_a_dry_run_past_a_node_it_cannot_reach_shows_every_node_marked(
    env: dict[str, str], sshd: Sshd, worker: str, why: str
) -> None:
    """`up --nodes --dry-run` still prints each node's part when a node cannot be reached: what could not
    be read off it is marked, never guessed, and the reason is a warning (a real start stops there)."""
    worker = worker.replace("{port}", str(sshd.port))
    env["SPARKCTL_SSH_OPTS"] = sshd.opts(sshd.other_key)  # the key the worker's sshd refuses
    proc = sparkctl(env, "up", GLM, "--nodes", f"localhost,{worker}", "--dry-run", *ON_LO)
    assert proc.returncode == 0, proc.stderr
    assert why in proc.stderr
    assert f"# [2] on {worker} (worker)" in proc.stdout
    assert f"NCCL_SOCKET_IFNAME={UNPROBED}" in proc.stdout.replace("'", "")
    assert "# dry run: nothing was started" in proc.stdout
