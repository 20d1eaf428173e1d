"""The preflight across nodes: each node probed for real (two trees on this machine standing in for two
Sparks), then the comparisons between them, and what `plan_cluster` makes of a failed check."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from fake_sysfs import make_model, spark

from sparkctl.cluster.nodes import Node, NodeUnreachable
from sparkctl.cluster.preflight import ClusterReport, ProbeRequest, _cross_checks, check_cluster
from sparkctl.cluster.probe import ModelProbe, parse_probe
from sparkctl.recipe.schema import ClusterSpec

REPO = "/hub/models--org--tiny"
GiB = 1024**3


def two_nodes(tmp_path: Path, *, worker_rev: str = "a" * 40, worker_gid: int = 3) -> list[Node]:
    head, worker = tmp_path / "head", tmp_path / "worker"
    spark(head, gid_index=3)
    spark(worker, gid_index=worker_gid)
    make_model(head, REPO, revision="a" * 40, index='{"weight_map": {}}')
    make_model(
        worker,
        REPO,
        revision=worker_rev,
        index='{"weight_map": {"x": "y"}}' if worker_rev != "a" * 40 else '{"weight_map": {}}',
    )
    return [Node("head", "localhost", sysroot=str(head)), Node("worker", "localhost", sysroot=str(worker))]


def failing(report: ClusterReport) -> dict[tuple[str, str], str]:
    return {(f.node, f.check): f.detail for f in report.findings if f.status == "fail"}


@pytest.mark.slow
def test_two_matching_nodes_pass_with_their_own_gid_index(tmp_path: Path) -> None:
    nodes = two_nodes(tmp_path, worker_gid=5)
    req = ProbeRequest(model=ModelProbe(REPO, "main"), memory_bytes=1 * GiB)
    report = check_cluster(nodes, ClusterSpec(nodes=2, tensor_parallel=2, executor="ray"), req)
    assert report.ok, failing(report)
    assert report.networks["head"].env()["NCCL_IB_GID_INDEX"] == "3"
    assert report.networks["worker"].env()["NCCL_IB_GID_INDEX"] == "5"  # per node, not the head's
    checks = {(f.node, f.check) for f in report.findings}
    assert {("head", "model"), ("worker", "model"), ("head", "memory"), ("all", "clock")} <= checks


@pytest.mark.slow
def test_a_different_model_revision_and_too_little_memory_fail(tmp_path: Path) -> None:
    nodes = two_nodes(tmp_path, worker_rev="b" * 40)
    req = ProbeRequest(model=ModelProbe(REPO, "main"), memory_bytes=400 * GiB)
    report = check_cluster(nodes, ClusterSpec(), req)
    fails = failing(report)
    assert "model revision differs" in fails[("all", "model")] and "bbbbbbbbbbbb" in fails[("all", "model")]
    assert "the plan needs 400.0 GiB" in fails[("worker", "memory")]


@pytest.mark.slow
def test_a_model_missing_on_the_worker(tmp_path: Path) -> None:
    nodes = two_nodes(tmp_path)
    shutil.rmtree(Path(nodes[1].sysroot) / "hub")
    report = check_cluster(nodes, ClusterSpec(), ProbeRequest(model=ModelProbe(REPO, "main")))
    assert f"model not at {REPO}" in failing(report)[("worker", "model")]


def test_clocks_more_than_a_second_apart_fail() -> None:
    report = ClusterReport(nodes=[Node("a", "a"), Node("b", "b")])
    report.facts["a"] = parse_probe("a", "time\t1000.0\n", local_mid=1000.0)
    report.facts["b"] = parse_probe("b", "time\t1002.5\n", local_mid=1000.0)
    (clock,) = [f for f in _cross_checks(report, ProbeRequest()) if f.check == "clock"]
    assert clock.status == "fail" and "2.5 s" in clock.detail and "timedatectl set-ntp true" in clock.fix


@pytest.mark.slow
def test_an_unreachable_node_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    nodes = [*two_nodes(tmp_path)[:1], Node("127.0.0.2:1", "127.0.0.2", port=1)]
    report = check_cluster(nodes, ClusterSpec(), ProbeRequest())
    detail = failing(report)[("127.0.0.2:1", "ssh")]
    assert "unreachable over SSH" in detail and "refused" in detail.lower()


def _docker_ok() -> bool:
    return (
        shutil.which("docker") is not None
        and subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    )


@pytest.mark.docker
@pytest.mark.skipif(not _docker_ok(), reason="needs a Docker engine")
def test_image_digest_and_ray_in_the_image(tmp_path: Path) -> None:
    image = "sparkctl-test:cpu"
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode:
        pytest.skip(f"needs the {image} image (make test-image)")
    nodes = two_nodes(tmp_path)
    report = check_cluster(nodes, ClusterSpec(), ProbeRequest(image=image, ray=True))
    found = {(f.node, f.check): f for f in report.findings}
    assert found[("head", "image")].status == found[("worker", "image")].status == "ok"
    assert ("all", "image") not in found  # same digest on both
    # the test image has no Python of its own, so no Ray: the finding names the image and the fix
    assert found[("worker", "ray")].status == "fail" and "pip install ray" in found[("worker", "ray")].fix
    absent = check_cluster(nodes[:1], ClusterSpec(), ProbeRequest(image="sparkctl-test:no-such-tag"))
    assert "not on this node" in failing(absent)[("head", "image")]


@pytest.mark.slow
def test_plan_cluster_raises_one_line_per_kind(tmp_path: Path) -> None:
    from sparkctl.cluster.plan import plan_cluster
    from sparkctl.errors import RuntimeFailure, UserError
    from sparkctl.recipe import load_recipe

    recipe = load_recipe("glm-5.3-flash-4bpw-2x", ["memory.pool_bytes=137438953472"])
    from sparkctl.planner import plan

    p = plan(recipe, check_memory=False)
    nodes = two_nodes(tmp_path)
    with pytest.raises(UserError, match=r"node head: interface enp1s0f1np1 not on this node"):
        plan_cluster(recipe, p, nodes)  # the recipe's netdev name is not this tree's
    with pytest.raises(NodeUnreachable, match="node 127.0.0.2:1 unreachable over SSH"):
        plan_cluster(recipe, p, [nodes[0], Node("127.0.0.2:1", "127.0.0.2", port=1)])
    assert issubclass(NodeUnreachable, RuntimeFailure)
