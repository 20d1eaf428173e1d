"""The Ray half of a two-node launch for real (PyPI `ray`): the head's and the worker's `ray start
--block` in two network namespaces, the worker over SSH, each with its own address, until `ray status`
lists both nodes; then `stop` leaves no Ray process in either namespace. The server step is not run:
vLLM's CPU build has no Ray device (the CPU end to end test serves over the mp executor instead).
sparkctl's side runs inside the head's namespace (a driver script), as `up` would on the head."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netns import HEAD_IP, WORKER_IP, namespaces
from sshd import sshd_missing

REPO = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).with_name("ray")

DRIVER = """
import dataclasses, json, sys, time
from sparkctl.cluster.launch import plan_launch
from sparkctl.cluster.plan import ClusterPlan, cluster_nodes
from sparkctl.cluster.preflight import check_cluster, request_for
from sparkctl.planner import plan
from sparkctl.recipe import load_recipe
from sparkctl.runtimes import cluster as cluster_run, state as state_files
from sparkctl.runtimes.registry import get_runtime

recipe = load_recipe("tiny", ["cluster.nodes=2", "cluster.pipeline_parallel=2", "cluster.executor=mp"])
ray_cluster = recipe.cluster.model_copy(update={"executor": "ray", "ray_port": 6390})
nodes = cluster_nodes(recipe, "localhost," + sys.argv[1])
p = plan(recipe, check_memory=False)
# no model here (this test starts no server); Ray on the nodes is checked (the venv's Python)
report = check_cluster(nodes, ray_cluster, dataclasses.replace(request_for(p, recipe), model=None, ray=True))
fails = [f.detail for f in report.findings if f.status == "fail"]
if fails:
    print(json.dumps({"fails": fails})); sys.exit(0)
launch = plan_launch(p, ray_cluster, [report.networks[n.address] for n in nodes])
ray_only = dataclasses.replace(launch, steps=launch.steps[:3])  # head, worker, wait until Ray lists both
t0 = time.monotonic()
runtime = get_runtime("cluster")
served = dataclasses.replace(p, runtime="cluster", cluster=ClusterPlan(report, ray_only))
state = runtime.start(served, state_files.log_path(recipe.name))
out = {"seconds": time.monotonic() - t0, "argv0": list(ray_only.steps[0].argv[:3]),
       "addresses": [n.address for n in report.networks.values()],
       "started": [s["node"] for s in state.parts], "rows": runtime.parts(state),
       "ray": sorted(f.detail for f in report.findings if f.check == "ray")}
if sys.argv[2] == "stop":
    runtime.stop(state)
    state_files.remove(recipe.name)
    out["state_left"] = state_files.state_path(recipe.name).exists()
print(json.dumps(out))
"""


def _missing() -> str | None:
    if sshd_missing():
        return sshd_missing()
    if not shutil.which("ip"):
        return "needs iproute2"
    if not RAY.exists():
        return "needs PyPI ray in the venv (pip install ray)"
    return None


pytestmark = [pytest.mark.e2e, pytest.mark.skipif(bool(_missing()), reason=_missing() or "")]


def test_ray_head_and_worker_come_up_and_go_away(tmp_path: Path) -> None:
    with namespaces(tmp_path, port=2223) as ns:
        env = dict(os.environ)
        env.update(
            SPARKCTL_SSH_OPTS=ns.sshd.opts(),
            SPARKCTL_SYSROOT=str(ns.tree),
            SPARKCTL_STATE_DIR=str(tmp_path / "state"),
            SPARKCTL_CACHE_DIR=str(tmp_path / "cache"),
            PYTHONPATH=f"{REPO}:{REPO / 'kernels'}",
        )
        argv = ["ip", "netns", "exec", ns.head_ns, sys.executable, "-c", DRIVER, ns.worker, "stop"]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert "fails" not in out, out
        assert out["addresses"] == [HEAD_IP, WORKER_IP]  # each node's own address on its own netdev
        assert out["argv0"] == [str(RAY), "start", "--head"]
        assert out["started"] == ["localhost", ns.worker]
        assert all(r["running"] for r in out["rows"]), out["rows"]
        assert out["state_left"] is False
        assert len(out["ray"]) == 2 and all(d.startswith("ray 2.") for d in out["ray"])
        print(f"\nRay head + worker over two namespaces: both listed after {out['seconds']:.1f}s")
        deadline = time.monotonic() + 30
        while (ns.pids(ns.worker_ns) or ns.pids(ns.head_ns)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ns.pids(ns.worker_ns) == set() and ns.pids(ns.head_ns) == set()
