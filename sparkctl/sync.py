"""`sparkctl sync RECIPE --to WORKER`: give the worker what the head has (the model's files, the image)
so the cluster preflight's "same model revision at the same path" and "same image digest" hold.

Each part is compared first and copied only when missing or different, so a second run copies nothing.
The model goes with rsync over the same SSH the rest of the cluster code uses (rsync sends only the
files that differ, resumes a cut copy, and keeps the hub cache's snapshot -> blob symlinks); it is
verified afterwards by its total size, file count and the sha256 of its index file on both sides.
The image is streamed `docker save | ssh WORKER docker load` when the digests differ.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkctl.cluster.nodes import Node, NodeUnreachable, run_on, ssh_failure
from sparkctl.cluster.probe import ModelFacts, ModelProbe, probe
from sparkctl.errors import RuntimeFailure, UserError

RSYNC_TIMEOUT_S = 24 * 3600.0  # a 160 GiB model over a slow link still finishes; rsync resumes a cut one


@dataclass(frozen=True)
class Tree:
    """A model directory as one node sees it: where, whether present, and what it holds."""

    path: str  # the node's own expanded path (the hub cache's repo dir, or the plain model dir)
    present: bool
    revision: str | None
    index_sha256: str | None
    files: int
    size: int  # bytes of every regular file, symlinks followed (the hub cache's blobs)

    def same_as(self, other: Tree) -> bool:
        return (
            self.present
            and other.present
            and (self.revision, self.index_sha256, self.files, self.size)
            == (other.revision, other.index_sha256, other.files, other.size)
        )


@dataclass
class PartResult:
    part: str  # "model" | "image"
    action: str  # "copied" | "in sync" | "skipped"
    detail: str
    bytes_sent: int = 0


@dataclass
class SyncResult:
    worker: str
    parts: list[PartResult] = field(default_factory=list)

    @property
    def copied(self) -> bool:
        return any(p.action == "copied" for p in self.parts)

    def to_json(self) -> dict[str, Any]:
        return {"worker": self.worker, "copied": self.copied, "parts": [asdict(p) for p in self.parts]}


def _root_dir(facts: ModelFacts, probe_req: ModelProbe) -> str:
    """The directory to copy: for a hub cache the whole repo dir (refs, snapshots and their blobs)."""
    if probe_req.ref and "/snapshots/" in facts.path:
        return facts.path.rsplit("/snapshots/", 1)[0]
    return facts.path


# every file once (symlinks followed, each inode counted once: a hub snapshot's links and their blobs)
_SIZE_SCRIPT = (
    'd={d}\nif [ -d "$d" ]; then find -L "$d" -type f -printf "%D:%i %s\\n" 2>/dev/null | sort -u | '
    "awk '{{s+=$2; n+=1}} END {{printf \"%d %d\\n\", n, s}}'; else echo '0 0'; fi\n"
)


def tree(node: Node, req: ModelProbe) -> Tree:
    """Probe the node's copy of the model (its own $HOME / HF cache expanded there) and measure it."""
    facts = probe(node, model=req).model
    if facts is None:
        raise RuntimeFailure(f"node {node.address}: the model probe printed nothing")
    root = _root_dir(facts, req)
    proc = run_on(node, _SIZE_SCRIPT.format(d=shlex.quote(node.sysroot.rstrip("/") + root)), timeout_s=300)
    count, _, size = proc.stdout.strip().partition(" ")
    return Tree(
        path=root,
        present=facts.present,
        revision=facts.revision,
        index_sha256=facts.index_sha256,
        files=int(count) if count.isdigit() else 0,
        size=int(size) if size.isdigit() else 0,
    )


def human(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _describe(t: Tree) -> str:
    rev = f"rev {t.revision[:12]}, " if t.revision else ""
    return f"{t.path} ({rev}{t.files} files, {human(t.size)})"


def free_bytes(node: Node, path: str) -> int | None:
    """Free space where `path` will be (its nearest existing parent) on the node."""
    script = (
        f'p={shlex.quote(path)}\nwhile [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done\n'
        "df -P -B1 \"$p\" | awk 'NR==2 {print $4}'\n"
    )
    out = run_on(node, script).stdout.strip()
    return int(out) if out.isdigit() else None


def _rsync_argv(head: Node, worker: Node, src: str, dest: str) -> list[str]:
    ssh = [*worker.ssh_argv()[:-1]]  # the same client options, without the destination
    target = f"{worker.user}@{worker.host}" if worker.user else worker.host
    return [
        "rsync",
        "-a",  # keeps the hub cache's relative snapshot -> blob symlinks as links
        "--copy-unsafe-links",  # a link out of the model dir (e.g. to a shared disk) goes as its file
        "--partial",
        "--delete",  # the worker's copy becomes the head's: stale files would change the size check
        "--stats",
        "--protect-args",  # the remote path goes as is (no remote shell word splitting)
        "-e",
        shlex.join(ssh),
        src.rstrip("/") + "/",
        f"{target}:{dest.rstrip('/')}/",
    ]


def sync_model(head: Node, worker: Node, req: ModelProbe, *, dry_run: bool = False) -> PartResult:
    if worker.is_local:
        raise UserError(f"--to {worker.address} is this machine: name the worker, e.g. --to user@spark2")
    src = tree(head, req)
    if not src.present:
        raise UserError(
            f"the model is not on this machine at {src.path}",
            hint="sparkctl prepare RECIPE (or up, which fetches it) first, then sync",
        )
    dst = tree(worker, req)
    if src.same_as(dst):
        return PartResult("model", "in sync", f"{worker.address} has {_describe(dst)}: nothing copied")
    why = "missing" if not dst.present else "different: " + _difference(src, dst)
    if dry_run:
        return PartResult("model", "would copy", f"{why}; would copy {_describe(src)} to {dst.path}")
    dest = worker.sysroot.rstrip("/") + dst.path
    need = max(0, src.size - (dst.size if dst.present else 0))
    free = free_bytes(worker, dest)
    if free is not None and free < need:
        raise RuntimeFailure(
            f"node {worker.address}: no space for the model: {human(need)} to copy, "
            f"{human(free)} free at {dst.path}",
            hint="free space there (or point the recipe's hf_cache / model.path at a bigger disk)",
        )
    if not shutil.which("rsync"):
        raise UserError("rsync not found on this machine: apt-get install rsync (on both nodes)")
    run_on(worker, f"mkdir -p {shlex.quote(dest)}\n")
    argv = _rsync_argv(head, worker, head.sysroot.rstrip("/") + src.path, dest)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=RSYNC_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise NodeUnreachable(
            f"node {worker.address}: rsync did not finish in {RSYNC_TIMEOUT_S:.0f}s"
        ) from None
    if proc.returncode != 0:
        raise _rsync_failure(worker, proc)
    after = tree(worker, req)
    if not src.same_as(after):
        raise RuntimeFailure(
            f"node {worker.address}: the copied model does not match the head's ({_difference(src, after)})",
            hint="run sparkctl sync again (rsync resumes); if it persists check the worker's disk",
        )
    sent = _bytes_sent(proc.stdout)
    return PartResult(
        "model", "copied", f"{why}; copied to {worker.address}: {_describe(after)} (verified)", sent
    )


def _difference(src: Tree, dst: Tree) -> str:
    parts = []
    if src.revision != dst.revision:
        parts.append(f"revision {(dst.revision or '-')[:12]} vs head {(src.revision or '-')[:12]}")
    if src.index_sha256 != dst.index_sha256:
        parts.append("index file hash")
    if (src.files, src.size) != (dst.files, dst.size):
        parts.append(f"{dst.files} files / {dst.size} B vs head {src.files} / {src.size} B")
    return ", ".join(parts) or "contents"


def _bytes_sent(stats: str) -> int:
    for line in stats.splitlines():
        if line.startswith("Total bytes sent:"):  # rsync --stats, e.g. "Total bytes sent: 5,115"
            digits = "".join(c for c in line.split(":", 1)[1] if c.isdigit())
            return int(digits or 0)
    return 0


def _rsync_failure(worker: Node, proc: subprocess.CompletedProcess[str]) -> RuntimeFailure:
    err = proc.stderr
    if "No space left on device" in err or "Disk quota exceeded" in err:
        return RuntimeFailure(
            f"node {worker.address}: no space left while copying the model",
            hint="free space on the worker's model disk, then sync again (rsync resumes)",
        )
    if proc.returncode == 255 or "connection unexpectedly closed" in err and "rsync:" not in err:
        return ssh_failure(worker, err)
    if "command not found" in err or "rsync: not found" in err:
        return RuntimeFailure(
            f"node {worker.address}: rsync is not installed there", hint="apt-get install rsync on the worker"
        )
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    return RuntimeFailure(
        f"node {worker.address}: rsync failed (exit {proc.returncode}): {(lines or ['-'])[-1]}"
    )


def image_ids(head: Node, worker: Node, image: str) -> tuple[str | None, str | None]:
    """The image's id (its content digest) on the head and on the worker; None where it is absent."""
    h = probe(head, image=image)
    if h.image_problem == "no docker":
        raise RuntimeFailure("docker not found on this machine", hint="sparkctl doctor")
    w = probe(worker, image=image)
    if w.image_problem == "no docker":
        raise RuntimeFailure(
            f"node {worker.address}: docker not found there", hint="install Docker on the worker"
        )
    return h.image_id, w.image_id


def sync_image(head: Node, worker: Node, image: str, *, dry_run: bool = False) -> PartResult:
    here, there = image_ids(head, worker, image)
    if here is None:
        raise UserError(
            f"no image {image} on this machine", hint="sparkctl build RECIPE (or docker pull) first"
        )
    if here == there:
        return PartResult("image", "in sync", f"{worker.address} has {image} ({here[:19]}): nothing copied")
    why = "missing" if there is None else f"different ({there[:19]} vs head {here[:19]})"
    if dry_run:
        return PartResult("image", "would copy", f"{why}; would stream {image} ({here[:19]})")
    from sparkctl.image.store import save_to_host
    from sparkctl.runtimes.docker import connect

    target = f"{worker.user}@{worker.host}" if worker.user else worker.host
    try:
        sent = save_to_host(
            connect(timeout_s=60), image, target, ssh=shlex.join(worker.ssh_argv()[:-1]), require_ours=False
        )
    except RuntimeFailure as exc:
        text = str(exc)
        if "no space left" in text.lower():
            raise RuntimeFailure(
                f"node {worker.address}: no space left for the image",
                hint="docker system prune on the worker",
            ) from None
        if "exit 255" in text:
            raise ssh_failure(worker, text) from None
        raise
    _, after = image_ids(head, worker, image)
    if after != here:
        raise RuntimeFailure(f"node {worker.address}: after docker load the image id is {after}, head {here}")
    return PartResult("image", "copied", f"{why}; loaded {image} on {worker.address} ({here[:19]})", sent)
