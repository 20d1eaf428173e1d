"""`sparkctl cluster check`: the multi-node preflight alone, one table for every node, a fix per finding."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from sparkctl.commands import output
from sparkctl.commands.options import json_option, set_option

if TYPE_CHECKING:
    from sparkctl.cluster.preflight import ClusterReport


@click.group("cluster", short_help="Check the nodes of a multi-Spark recipe.")
def cluster_group() -> None:
    """Commands for serving one recipe over several Sparks (see the README's "Two Sparks")."""


@cluster_group.command(
    "check", short_help="Preflight every node: links, RoCE/GIDs, clocks, image, model, memory."
)
@click.argument("recipe", required=False)
@click.option(
    "--nodes", metavar="HEAD,WORKER", default=None, help="The nodes as [user@]host[:port], head first."
)
@set_option
@click.option(
    "--apply",
    is_flag=True,
    help="Run the safe fixes (link up, MTU 9000 until reboot, drop the page cache), then check again.",
)
@json_option
def check_cmd(
    recipe: str | None, nodes: str | None, sets: tuple[str, ...], apply: bool, as_json: bool
) -> None:
    """Probe every node in parallel (over SSH; localhost directly) and compare them.

    Checks: the ConnectX-7 interface is up with an address and MTU 9000, both RoCE twins of the port,
    a non-zero GID index on every node, clocks within a second; with RECIPE also the same image digest,
    Ray in it, the same model revision at the same path, and free memory against each node's plan.
    Nothing on a node changes unless --apply. Exit 1 when a check fails.
    """
    from sparkctl.cluster.nodes import parse_nodes
    from sparkctl.cluster.plan import cluster_nodes
    from sparkctl.cluster.preflight import ProbeRequest, check_cluster, request_for
    from sparkctl.errors import UserError
    from sparkctl.recipe.schema import ClusterSpec

    if recipe:
        from sparkctl.plans import load_and_plan

        the_recipe, the_plan = load_and_plan(recipe, sets, check_memory=False)
        node_list = cluster_nodes(the_recipe, nodes)
        cluster = the_recipe.cluster
        req = request_for(the_plan, the_recipe)
    else:
        if sets:
            raise UserError("--set needs a RECIPE")
        if not nodes:
            raise UserError("name the nodes: sparkctl cluster check [RECIPE] --nodes HEAD,WORKER")
        node_list = parse_nodes(nodes)
        cluster = ClusterSpec()
        req = ProbeRequest()
    report = check_cluster(node_list, cluster, req, apply=apply)
    if as_json:
        output.json(report.to_json())
    else:
        _render(report)
    click.get_current_context().exit(0 if report.ok else 1)


def _render(report: ClusterReport) -> None:
    from rich.table import Table

    style = {"ok": "green", "warn": "yellow", "fail": "bold red"}
    table = Table(title="sparkctl cluster check")
    for col in ("node", "check", "status", "detail", "fix"):
        table.add_column(col)
    for f in report.findings:
        table.add_row(f.node, f.check, f"[{style[f.status]}]{f.status}[/]", f.detail, f.fix)
    output.table(table)
    for line in report.applied:
        output.text(f"applied: {line}")
    for node, net in report.networks.items():
        env = " ".join(f"{k}={v}" for k, v in net.env().items())
        output.text(f"env {node}: {env}")
    fails = sum(f.status == "fail" for f in report.findings)
    warns = sum(f.status == "warn" for f in report.findings)
    output.text(f"{fails} failed, {warns} warning(s), {len(report.findings) - fails - warns} passed")


@click.command("sync", short_help="Copy the recipe's model and image to a worker Spark when they differ.")
@click.argument("recipe")
@click.option(
    "--to", "to", required=True, metavar="WORKER", help="The worker as [user@]host[:port] (over SSH)."
)
@set_option
@click.option("--dry-run", is_flag=True, help="Compare only: say what would be copied.")
@json_option
def sync_cmd(recipe: str, to: str, sets: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Give WORKER this machine's copy of RECIPE's model (rsync over SSH, verified by size, file count
    and the index file's sha256) and, for a docker recipe, its image (docker save | ssh docker load)
    when the digests differ. Each part is copied only when missing or different: a second run copies
    nothing and says so.
    """
    from sparkctl.cluster.nodes import parse_node
    from sparkctl.cluster.preflight import model_probe_for
    from sparkctl.plans import load_and_plan
    from sparkctl.sync import SyncResult, sync_image, sync_model

    the_recipe, the_plan = load_and_plan(recipe, sets, check_memory=False)
    head, worker = parse_node("localhost"), parse_node(to)
    result = SyncResult(worker=worker.address)
    req = model_probe_for(the_plan, the_recipe)
    if req is not None:
        result.parts.append(sync_model(head, worker, req, dry_run=dry_run))
    if the_plan.container and the_plan.container.image:
        result.parts.append(sync_image(head, worker, the_plan.container.image, dry_run=dry_run))
    if as_json:
        output.json(result.to_json())
        return
    for part in result.parts:
        output.text(f"{part.part}: {part.action}: {part.detail}")
    if not result.copied and not dry_run:
        output.text(f"{worker.address} already has everything {the_recipe.name} needs: nothing copied")
