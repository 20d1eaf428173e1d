"""From a single-node plan and the nodes to the cluster plan: preflight every node, then each node's
commands and environment. Any failed finding stops here, as one line with its fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkctl.cluster.launch import ClusterLaunch, plan_launch, render_launch
from sparkctl.cluster.netenv import NodeNetwork
from sparkctl.cluster.nodes import Node, NodeAuthRefused, NodeUnreachable, parse_nodes
from sparkctl.cluster.preflight import ClusterReport, check_cluster, request_for
from sparkctl.errors import RuntimeFailure, UserError

_NETWORK_CHECKS = ("ssh", "interface", "address", "roce", "gid")


@dataclass(frozen=True)
class ClusterPlan:
    report: ClusterReport
    launch: ClusterLaunch

    def to_json(self) -> dict[str, Any]:
        return {"preflight": self.report.to_json(), "launch": self.launch.to_json()}

    def render_shell(self) -> str:
        """What `render`/`up --dry-run` print for a plan served across nodes: each node's part, in order."""
        return render_launch(self.launch)


def cluster_nodes(recipe: Any, nodes: str | None) -> list[Node]:
    """`--nodes` if given, else the recipe's cluster.hosts; their count must be cluster.nodes."""
    specs: Any = nodes if nodes else list(recipe.cluster.hosts)
    if not specs:
        raise UserError(
            f"recipe {recipe.name} runs on {recipe.cluster.nodes} nodes: name them with --nodes HEAD,WORKER "
            "(or cluster.hosts in the recipe)"
        )
    found = parse_nodes(specs)
    if len(found) != recipe.cluster.nodes:
        raise UserError(
            f"recipe {recipe.name} is for cluster.nodes={recipe.cluster.nodes}, --nodes names {len(found)} "
            f"({', '.join(n.address for n in found)})",
            hint=f"name {recipe.cluster.nodes} nodes, head first, or --set cluster.nodes=N",
        )
    return found


def plan_cluster(recipe: Any, plan: Any, nodes: list[Node], *, strict: bool = True) -> ClusterPlan:
    """Preflight + per-node launch. `strict` False (a dry run) stops only where a node's environment
    cannot be computed (unreachable, no interface, no GID); other failed checks stay in the report."""
    report = check_cluster(nodes, recipe.cluster, request_for(plan, recipe))
    fail = sorted(report.failures(), key=lambda f: f.check != "ssh")  # an unreachable node first
    if not strict:
        # a dry run still shows every node's part: a node it cannot reach gets its values marked
        # not probed (the failed check is in the report, shown as a warning); a bad value still stops it
        unreachable = {f.node for f in fail if f.check == "ssh"}
        fail = [f for f in fail if f.check in _NETWORK_CHECKS and f.node not in unreachable]
        if not fail and unreachable:
            networks = [report.networks.get(n.address) or NodeNetwork.unprobed(n.address) for n in nodes]
            return ClusterPlan(report=report, launch=plan_launch(plan, recipe.cluster, networks))
    if fail:
        first = fail[0]
        more = f" (and {len(fail) - 1} more: sparkctl cluster check)" if len(fail) > 1 else ""
        where = "" if first.node == "all" or first.detail.startswith("node ") else f"node {first.node}: "
        message = f"{where}{first.detail}{more}"
        if first.check == "ssh":
            ssh_error = NodeAuthRefused if "refused the login" in first.detail else NodeUnreachable
            raise ssh_error(message, hint=first.fix or None)
        error = UserError if first.bad_input else RuntimeFailure
        raise error(message, hint=first.fix or None)
    networks = [report.networks[n.address] for n in nodes]
    return ClusterPlan(report=report, launch=plan_launch(plan, recipe.cluster, networks))
