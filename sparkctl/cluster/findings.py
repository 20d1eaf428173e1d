"""One preflight finding: what was checked on which node, how it stands, and the fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Finding:
    node: str  # a node's address, or "all" for a comparison across nodes
    check: str  # interface, mtu, roce, gid, address, clock, memory, image, ray, model, ssh
    status: Status
    detail: str
    fix: str = ""
    apply: tuple[str, ...] = ()  # shell commands `cluster check --apply` may run on the node (safe ones)
    bad_input: bool = False  # the recipe or --set names something this node lacks (exit 2, not 1)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
