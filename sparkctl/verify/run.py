"""Run the three layers on one pack and return the record (the CLI, `up --verify` and tests call this)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from sparkctl.verify import engine, kernels, pack
from sparkctl.verify.records import FAIL, SKIP, Check, VerifyRecord, latest


def drift(digests: dict[str, str], previous: VerifyRecord | None, model_dir: Path) -> Check:
    """Tensors read now whose bytes differ from what the last verification of this pack read."""
    c = Check("pack", "unchanged since last verify", note="digest of every tensor read vs the last record")
    if previous is None or Path(previous.model_dir) != Path(model_dir) or not previous.digests:
        c.verdict, c.note = SKIP, "no earlier verification of this directory to compare with"
        return c
    for name, digest in sorted(digests.items()):
        old = previous.digests.get(name)
        if old is None:
            continue
        c.checked += 1
        if old != digest:
            c.fail(
                name.rpartition(".")[0],
                f"{name} changed on disk since the verification of {previous.created_at}",
            )
    return c


def verify(
    model_dir: Path,
    *,
    name: str,
    full: bool = False,
    device: str = "auto",
    server: engine.EngineTarget | None = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> VerifyRecord:
    """Check one pack: its files, its modules through the plugin's path, and (with `server`) the engine."""
    t0 = time.monotonic()
    model_dir = Path(model_dir)
    progress("pack: reading headers")
    p = pack.open_pack(model_dir)
    pack_checks, facts, hashed = pack.run(p, full=full)
    kernel_checks, dev, _ = kernels.run(p, facts, full=full, device=device, progress=progress)
    progress("engine")
    engine_checks = engine.run(model_dir, p.config, p.total_bytes, server, dev.name)
    previous = latest(name)
    moved = drift(p.reader.digests, previous, model_dir)
    digests = dict(p.reader.digests)
    if previous is not None and Path(previous.model_dir) == model_dir:
        # keep what earlier runs read and this one did not, and never let a changed tensor become the new baseline
        changed = {f.reason.split(" ", 1)[0] for f in moved.failures}
        digests = {
            **previous.digests,
            **digests,
            **{n: previous.digests[n] for n in changed if n in previous.digests},
        }
    return VerifyRecord(
        recipe=name,
        model_dir=str(model_dir),
        mode="full" if full else "quick",
        device=dev.label,
        checks=[*pack_checks, moved, *kernel_checks, *engine_checks],
        bytes_read=p.reader.bytes_read + hashed,
        pack_bytes=p.total_bytes,
        seconds=time.monotonic() - t0,
        digests=digests,
    )


def failure_line(record: VerifyRecord) -> str:
    """One line naming the first failing module (the CLI's error, `up --verify`'s refusal)."""
    bad = record.failures()
    if not bad:
        return ""
    check, f = bad[0]
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return f"verify {record.recipe}: {check.what}: {f.module}: {f.reason}{more}"


__all__ = ["FAIL", "failure_line", "verify"]
