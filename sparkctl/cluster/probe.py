"""What one node has, read on that node in one round trip: links, RoCE devices and GIDs, addresses,
memory, clock, the image's digest, Ray, and the model's revision.

The probe is a POSIX sh script (a Spark has no sparkctl on the worker) that prints tab-separated facts;
`parse_probe` turns them into a `NodeFacts`. Every file read (sysfs, procfs, the model) is under the node's
`sysroot`, so a test points it at a tree laid out like the real `/sys` and `/proc`; on a real host it is
empty and the real ones are read.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from dataclasses import dataclass, field

from sparkctl.cluster.nodes import Node, run_on
from sparkctl.errors import RuntimeFailure

_SCRIPT = r"""
R=$SYSROOT
printf 'time\t%s\n' "$(date +%s.%N)"
printf 'hostname\t%s\n' "$(hostname 2>/dev/null || cat "$R"/proc/sys/kernel/hostname)"
for d in "$R"/sys/class/net/*; do
  [ -e "$d" ] || continue
  printf 'net\t%s\t%s\t%s\n' "${d##*/}" "$(cat "$d/operstate" 2>/dev/null)" "$(cat "$d/mtu" 2>/dev/null)"
done
for d in "$R"/sys/class/infiniband/*; do
  [ -e "$d" ] || continue
  dev=${d##*/}
  for nd in "$d"/device/net/*; do [ -e "$nd" ] && printf 'ibnet\t%s\t%s\n' "$dev" "${nd##*/}"; done
  grep -H '' "$d"/ports/1/gids/* 2>/dev/null | sed "s|^|gid\t$dev\t|"
  grep -H '' "$d"/ports/1/gid_attrs/types/* 2>/dev/null | sed "s|^|gidtype\t$dev\t|"
done
ip -o -4 addr show 2>/dev/null | awk '{print "addr\t" $2 "\t" $4}'
grep -E '^(MemTotal|MemAvailable):' "$R"/proc/meminfo 2>/dev/null | awk '{print "mem\t" $1 "\t" $2}'
if [ -n "$IMAGE" ]; then
  if id=$(docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null); then
    printf 'image\t%s\n' "$id"
    if [ -n "$RAYCHECK" ]; then
      v=$(docker run --rm --network none --entrypoint python3 "$IMAGE" -c 'import ray; print(ray.__version__)' 2>/dev/null)
      printf 'ray\t%s\n' "${v:--}"
    fi
  elif command -v docker >/dev/null 2>&1; then printf 'image\t-\tabsent\n'
  else printf 'image\t-\tno docker\n'; fi
elif [ -n "$RAYCHECK" ]; then
  v=$("${PYTHON:-python3}" -c 'import ray; print(ray.__version__)' 2>/dev/null)
  printf 'ray\t%s\n' "${v:--}"
fi
if [ -n "$MODEL_DIR" ]; then
  dir=$(eval echo "$MODEL_DIR")
  rev=-
  if [ -n "$MODEL_REF" ] && [ -f "$R$dir/refs/$MODEL_REF" ]; then rev=$(cat "$R$dir/refs/$MODEL_REF"); dir="$dir/snapshots/$rev"
  elif [ -n "$MODEL_REF" ] && [ -d "$R$dir/snapshots/$MODEL_REF" ]; then rev=$MODEL_REF; dir="$dir/snapshots/$rev"; fi
  idx=-
  for f in model.safetensors.index.json config.json; do
    if [ -f "$R$dir/$f" ]; then idx=$(sha256sum "$R$dir/$f" | cut -c1-64); break; fi
  done
  if [ -d "$R$dir" ]; then e=present; else e=missing; fi
  printf 'model\t%s\t%s\t%s\t%s\n' "$dir" "$e" "$rev" "$idx"
fi
"""


@dataclass(frozen=True)
class ModelProbe:
    """Where to look for the model on a node: a hub repo's cache dir (+ the ref) or a plain directory."""

    directory: str  # may start with ~ or $HOME: expanded on the node
    ref: str | None = None  # hub revision (branch, tag or commit) for a cache dir; None for a plain dir


@dataclass(frozen=True)
class NetDev:
    name: str
    operstate: str
    mtu: int | None


@dataclass(frozen=True)
class ModelFacts:
    path: str
    present: bool
    revision: str | None
    index_sha256: str | None


@dataclass
class NodeFacts:
    node: str
    hostname: str = ""
    clock_offset_s: float = 0.0  # node clock minus this machine's, at the middle of the round trip
    netdevs: dict[str, NetDev] = field(default_factory=dict)
    ib_netdevs: dict[str, list[str]] = field(default_factory=dict)  # RoCE device -> its netdev(s)
    gids: dict[str, dict[int, str]] = field(default_factory=dict)  # RoCE device -> port 1 index -> GID
    gid_types: dict[str, dict[int, str]] = field(default_factory=dict)  # "RoCE v2", "IB/RoCE v1"
    addresses: dict[str, list[str]] = field(default_factory=dict)  # netdev -> IPv4 addresses
    mem_total: int | None = None
    mem_available: int | None = None
    image_id: str | None = None
    image_problem: str | None = None  # "absent", "no docker"
    ray_version: str | None = None
    ray_checked: bool = False
    model: ModelFacts | None = None

    def netdev_of(self, hca: str) -> str | None:
        names = self.ib_netdevs.get(hca) or []
        return names[0] if names else None


def probe_script(
    *,
    sysroot: str = "",
    image: str | None = None,
    ray_check: bool = False,
    python: str | None = None,
    model: ModelProbe | None = None,
) -> str:
    assigns = {
        "SYSROOT": sysroot.rstrip("/"),
        "IMAGE": image or "",
        "RAYCHECK": "1" if ray_check else "",
        "PYTHON": python or "",
        "MODEL_DIR": model.directory if model else "",
        "MODEL_REF": (model.ref or "") if model else "",
    }
    head = "".join(f"{k}={shlex.quote(v)}\n" for k, v in assigns.items())
    return head + _SCRIPT


def probe(
    node: Node,
    *,
    image: str | None = None,
    ray_check: bool = False,
    python: str | None = None,
    model: ModelProbe | None = None,
) -> NodeFacts:
    """Run the probe on `node` and parse what it printed."""
    script = probe_script(sysroot=node.sysroot, image=image, ray_check=ray_check, python=python, model=model)
    t0 = time.time()
    proc = run_on(node, script, timeout_s=120)
    t1 = time.time()
    if proc.returncode != 0 and "time\t" not in proc.stdout:
        raise RuntimeFailure(f"node {node.address}: the probe failed: {proc.stderr.strip()[-200:]}")
    return parse_probe(node.address, proc.stdout, local_mid=(t0 + t1) / 2)


def parse_probe(node: str, text: str, *, local_mid: float | None = None) -> NodeFacts:
    facts = NodeFacts(node=node)
    for line in text.splitlines():
        kind, _, rest = line.partition("\t")
        cols = rest.split("\t")
        if kind == "time" and local_mid is not None:
            with contextlib.suppress(ValueError):
                facts.clock_offset_s = float(cols[0]) - local_mid
        elif kind == "hostname":
            facts.hostname = cols[0]
        elif kind == "net" and len(cols) >= 3:
            mtu = int(cols[2]) if cols[2].isdigit() else None
            facts.netdevs[cols[0]] = NetDev(cols[0], cols[1].strip().lower(), mtu)
        elif kind == "ibnet" and len(cols) >= 2:
            facts.ib_netdevs.setdefault(cols[0], []).append(cols[1])
        elif kind in ("gid", "gidtype") and len(cols) >= 2:
            path, _, value = cols[1].partition(":")  # grep -H: PATH:VALUE (a GID has colons too)
            index_text = path.rsplit("/", 1)[-1]
            if index_text.isdigit():
                table = facts.gids if kind == "gid" else facts.gid_types
                table.setdefault(cols[0], {})[int(index_text)] = value.strip()
        elif kind == "addr" and len(cols) >= 2:
            facts.addresses.setdefault(cols[0], []).append(cols[1].split("/")[0])
        elif kind == "mem" and len(cols) >= 2 and cols[1].isdigit():
            value = int(cols[1]) * 1024
            if cols[0] == "MemTotal:":
                facts.mem_total = value
            elif cols[0] == "MemAvailable:":
                facts.mem_available = value
        elif kind == "image":
            if cols[0] != "-":
                facts.image_id = cols[0]
            else:
                facts.image_problem = cols[1] if len(cols) > 1 else "absent"
        elif kind == "ray":
            facts.ray_checked = True
            facts.ray_version = None if cols[0] in ("-", "") else cols[0]
        elif kind == "model" and len(cols) >= 4:
            facts.model = ModelFacts(
                path=cols[0],
                present=cols[1] == "present",
                revision=None if cols[2] == "-" else cols[2],
                index_sha256=None if cols[3] == "-" else cols[3],
            )
    return facts


def is_zero_gid(gid: str) -> bool:
    return not gid.replace(":", "").strip("0")
