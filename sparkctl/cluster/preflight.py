"""The cluster preflight: every node probed in parallel, then each node's own checks and the checks
that compare nodes (same image digest, same model revision at the same path, clocks within a second).

It reads only, unless `apply` is set: then the findings' safe fixes (bring a link up, raise its MTU,
drop the page cache for memory) run on their node, and the node is probed again.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sparkctl.cluster.findings import Finding
from sparkctl.cluster.netenv import NodeNetwork, resolve_network
from sparkctl.cluster.nodes import Node, run_on
from sparkctl.cluster.probe import ModelProbe, NodeFacts, probe
from sparkctl.errors import RuntimeFailure

MAX_CLOCK_SKEW_S = 1.0
_GiB = 1024**3


@dataclass
class ClusterReport:
    nodes: list[Node]
    facts: dict[str, NodeFacts] = field(default_factory=dict)
    networks: dict[str, NodeNetwork] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)  # "node: command" run by --apply

    @property
    def ok(self) -> bool:
        return not any(f.status == "fail" for f in self.findings)

    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "fail"]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "nodes": [n.address for n in self.nodes],
            "env": {k: v.env() for k, v in self.networks.items()},
            "findings": [f.to_json() for f in self.findings],
            "applied": self.applied,
        }


@dataclass(frozen=True)
class ProbeRequest:
    """What the recipe asks every node to have (image, Ray, the model, memory)."""

    image: str | None = None
    ray: bool = False
    python: str | None = None
    model: ModelProbe | None = None
    memory_bytes: int | None = None  # what one node's share of the plan needs free


def model_probe_for(plan: Any, recipe: Any) -> ModelProbe | None:
    """Where the plan's model lives on a node: the hub cache dir the container mounts, or the path."""
    m = plan.model
    if m.repo:
        if recipe.runtime == "docker" and recipe.container.hf_cache:
            base = recipe.container.hf_cache.replace("~", "$HOME", 1) + "/hub"
        else:
            base = "${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}"
        return ModelProbe(f"{base}/models--{m.repo.replace('/', '--')}", m.revision or "main")
    if m.path:
        return ModelProbe(m.path)
    if m.generate:
        from sparkctl.paths import generated_model_dir

        return ModelProbe(str(generated_model_dir(m.generate)))
    return None


def request_for(plan: Any, recipe: Any) -> ProbeRequest:
    import sys

    ray = recipe.cluster.executor == "ray"
    return ProbeRequest(
        image=plan.container.image if plan.container else None,
        ray=ray,
        python=None
        if plan.container
        else (plan.argv[0] if plan.argv and "python" in plan.argv[0] else sys.executable),
        model=model_probe_for(plan, recipe),
        memory_bytes=plan.memory.budget_bytes if plan.memory else None,
    )


def _probe_one(node: Node, req: ProbeRequest) -> NodeFacts | Finding:
    try:
        return probe(
            node,
            image=req.image,
            ray_check=req.ray,
            python=req.python,
            model=req.model,
        )
    except RuntimeFailure as exc:
        return Finding(node.address, "ssh", "fail", str(exc), exc.hint or "")


def check_cluster(
    nodes: list[Node], cluster: Any, req: ProbeRequest, *, apply: bool = False
) -> ClusterReport:
    report = ClusterReport(nodes=nodes)
    _probe_all(report, cluster, req)
    if apply:
        todo = [(f.node, cmd) for f in report.findings if f.status != "ok" for cmd in f.apply]
        if todo:
            by_addr = {n.address: n for n in nodes}
            for addr, cmd in todo:
                proc = run_on(by_addr[addr], cmd + "\n", timeout_s=30)
                status = "done" if proc.returncode == 0 else f"failed: {proc.stderr.strip()[-120:]}"
                report.applied.append(f"{addr}: {cmd} ({status})")
            applied = report.applied
            report = ClusterReport(nodes=nodes, applied=applied)
            _probe_all(report, cluster, req)
    return report


def _probe_all(report: ClusterReport, cluster: Any, req: ProbeRequest) -> None:
    with ThreadPoolExecutor(max_workers=max(1, len(report.nodes))) as pool:
        results = list(pool.map(lambda n: _probe_one(n, req), report.nodes))
    for node, result in zip(report.nodes, results, strict=True):
        if isinstance(result, Finding):
            report.findings.append(result)
            continue
        report.facts[node.address] = result
        network, found = resolve_network(result, cluster)
        report.findings += found
        if network is not None:
            report.networks[node.address] = network
        report.findings += _node_checks(node, result, req, head=report.nodes[0])
    report.findings += _cross_checks(report, req)


def _node_checks(n: Node, facts: NodeFacts, req: ProbeRequest, *, head: Node) -> list[Finding]:
    node = facts.node
    is_head = n == head
    out: list[Finding] = []
    if req.memory_bytes is not None and facts.mem_available is not None:
        need, free = req.memory_bytes, facts.mem_available
        if free < need:
            out.append(
                Finding(
                    node,
                    "memory",
                    "fail",
                    f"{free / _GiB:.1f} GiB available, the plan needs {need / _GiB:.1f} GiB on each node",
                    "stop what holds memory there (`sparkctl status`, docker ps), drop the page cache, "
                    "or lower serve.gpu_memory_utilization",
                    apply=("sync && echo 3 > /proc/sys/vm/drop_caches",),
                )
            )
        else:
            out.append(
                Finding(node, "memory", "ok", f"{free / _GiB:.1f} GiB available, needs {need / _GiB:.1f}")
            )
    if req.image:
        if facts.image_id:
            out.append(Finding(node, "image", "ok", facts.image_id[:19]))
        else:
            problem = facts.image_problem or "absent"
            fix = (
                f"build or load {req.image} on the head first"
                if is_head
                else f"from the head: docker save {req.image} | {n.ssh_command} docker load"
            )
            out.append(
                Finding(
                    node,
                    "image",
                    "fail",
                    f"image {req.image} {'not on this node' if problem == 'absent' else problem}",
                    fix,
                )
            )
    if req.ray:
        where = f"image {req.image}" if req.image else "the node's Python"
        if facts.ray_version:
            out.append(Finding(node, "ray", "ok", f"ray {facts.ray_version} in {where}"))
        elif facts.ray_checked and (facts.image_id or not req.image):
            out.append(
                Finding(
                    node,
                    "ray",
                    "fail",
                    f"Ray is missing from {where} (newer vLLM images ship without it)",
                    "pip install ray into the image (or set cluster.executor: mp)",
                )
            )
    if req.model is not None:
        m = facts.model
        if m is None or not m.present:
            path = m.path if m else req.model.directory
            target = f"{n.user}@{n.host}" if n.user else n.host
            ssh = f" -e 'ssh -p {n.port}'" if n.port else ""
            fix = (
                "download it on the head first (`sparkctl up` fetches it there)"
                if is_head
                else f"copy it once over the fabric, from the head: sparkctl sync RECIPE --to {n.address} "
                f"(or rsync -a{ssh} {path}/ {target}:{path}/)"
            )
            out.append(Finding(node, "model", "fail", f"model not at {path}", fix))
        else:
            out.append(Finding(node, "model", "ok", f"{m.path} rev {(m.revision or '-')[:12]}"))
    return out


def _cross_checks(report: ClusterReport, req: ProbeRequest) -> list[Finding]:
    facts = [report.facts[n.address] for n in report.nodes if n.address in report.facts]
    if len(facts) < 2:
        return []
    out: list[Finding] = []
    head = facts[0]
    if req.image:
        differ = [f.node for f in facts[1:] if f.image_id and head.image_id and f.image_id != head.image_id]
        if differ:
            out.append(
                Finding(
                    "all",
                    "image",
                    "fail",
                    f"image {req.image} differs from the head's ({head.image_id[:19] if head.image_id else '-'}) "
                    f"on {', '.join(differ)}",
                    f"load the head's image there: sparkctl sync RECIPE --to NODE "
                    f"(or docker save {req.image} | ssh NODE docker load)",
                )
            )
    if req.model is not None and head.model and head.model.present:
        differ = []
        for f in facts[1:]:
            m = f.model
            if not (m and m.present):
                continue
            if m.path != head.model.path:
                differ.append(f"{f.node} (at {m.path}, head at {head.model.path})")
            elif m.revision != head.model.revision or m.index_sha256 != head.model.index_sha256:
                differ.append(
                    f"{f.node} (revision {(m.revision or '-')[:12]}, index {(m.index_sha256 or '-')[:12]}; "
                    f"head {(head.model.revision or '-')[:12]}, {(head.model.index_sha256 or '-')[:12]})"
                )
        if differ:
            out.append(
                Finding(
                    "all",
                    "model",
                    "fail",
                    "model revision differs from the head's on " + "; ".join(differ),
                    "copy the head's snapshot to the same path on every node: sparkctl sync RECIPE --to NODE "
                    "(or rsync -a --delete)",
                )
            )
    offsets = [f.clock_offset_s for f in facts]
    skew = max(offsets) - min(offsets)
    if skew > MAX_CLOCK_SKEW_S:
        out.append(
            Finding(
                "all",
                "clock",
                "fail",
                f"clocks differ by {skew:.1f} s (more than {MAX_CLOCK_SKEW_S:.0f} s)",
                "turn on NTP on every node: timedatectl set-ntp true (chrony or systemd-timesyncd)",
            )
        )
    else:
        out.append(Finding("all", "clock", "ok", f"within {skew:.2f} s"))
    return out
