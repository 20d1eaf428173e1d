"""A sysfs + procfs tree laid out like a DGX Spark's, for the probe to read (its root is the tmp dir).

Real layout: /sys/class/net/<netdev>/{operstate,mtu}; /sys/class/infiniband/<dev>/device/net/<netdev>
(the PCI function's netdev, what `ibdev2netdev` prints); /sys/class/infiniband/<dev>/ports/1/gids/<i>
and .../gid_attrs/types/<i>; /proc/meminfo.
"""

from __future__ import annotations

from pathlib import Path

ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
V2 = "RoCE v2"


def v4_gid(address: str) -> str:
    a, b, c, d = (int(x) for x in address.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def make_node(
    root: Path,
    *,
    ports: dict[str, tuple[str, str, int]],  # roce device -> (netdev, operstate, mtu)
    gids: dict[str, dict[int, tuple[str, str]]],  # roce device -> index -> (gid, type)
    mem_available_kib: int = 120 * 1024 * 1024,
    extra_netdevs: dict[str, tuple[str, int]] | None = None,
) -> Path:
    for dev, (netdev, state, mtu) in ports.items():
        net = root / "sys/class/net" / netdev
        net.mkdir(parents=True, exist_ok=True)
        (net / "operstate").write_text(state + "\n")
        (net / "mtu").write_text(f"{mtu}\n")
        ib = root / "sys/class/infiniband" / dev
        (ib / "device/net" / netdev).mkdir(parents=True, exist_ok=True)
        (ib / "ports/1/gids").mkdir(parents=True, exist_ok=True)
        (ib / "ports/1/gid_attrs/types").mkdir(parents=True, exist_ok=True)
        for i in range(8):
            gid, kind = gids.get(dev, {}).get(i, (ZERO, ""))
            (ib / "ports/1/gids" / str(i)).write_text(gid + "\n")
            if kind:
                (ib / "ports/1/gid_attrs/types" / str(i)).write_text(kind + "\n")
    for netdev, (state, mtu) in (extra_netdevs or {}).items():
        net = root / "sys/class/net" / netdev
        net.mkdir(parents=True, exist_ok=True)
        (net / "operstate").write_text(state + "\n")
        (net / "mtu").write_text(f"{mtu}\n")
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/meminfo").write_text(
        f"MemTotal:       127600000 kB\nMemFree:        1000 kB\nMemAvailable:   {mem_available_kib} kB\n"
    )
    return root


def make_model(root: Path, directory: str, *, revision: str, index: str) -> None:
    """A hub cache entry under `root`: refs/main -> snapshots/<revision>/model.safetensors.index.json."""
    repo = root / directory.lstrip("/")
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs/main").write_text(revision)
    snap = repo / "snapshots" / revision
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "model.safetensors.index.json").write_text(index)


def spark(
    root: Path, *, gid_index: int = 3, state: str = "up", mtu: int = 9000, twin_up: bool = True
) -> Path:
    """lo stands for enp1s0f1np1 (RoCE rocep1s0f1); enP2lo behind roceP2p1s0f1 is its PCIe twin."""
    gids = {
        "rocep1s0f1": {
            0: ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "IB/RoCE v1"),
            gid_index: (v4_gid("127.0.0.1"), V2),
        },
        "roceP2p1s0f1": {
            0: ("fe80:0000:0000:0000:0000:00ff:fe00:0002", "IB/RoCE v1"),
            gid_index: (v4_gid("127.0.0.2"), V2),
        },
        "rocep1s0f0": {},
    }
    return make_node(
        root,
        ports={
            "rocep1s0f1": ("lo", state, mtu),
            "roceP2p1s0f1": ("enP2lo", "up" if twin_up else "down", mtu),
            "rocep1s0f0": ("enp1s0f0np0", "down", 1500),
        },
        gids=gids,
    )
