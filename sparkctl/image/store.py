"""The images sparkctl built on this machine: list them, remove one, ship one to another host.

Only images carrying sparkctl's inputs-hash label are ours; `rm` refuses anything else, so a typo cannot
delete someone's base image. Shipping is `docker save | ssh HOST docker load`, streamed (a 20 GB image
never lands on disk), for the second Spark of a pair and for boxes without a registry.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from typing import Any

from sparkctl.errors import RuntimeFailure, UserError
from sparkctl.image.context import BASE_DIGEST_LABEL, BASE_LABEL, HASH_LABEL, VERSION_LABEL
from sparkctl.pins import PIN_LABEL_PREFIX


@dataclass(frozen=True)
class ImageRecord:
    id: str
    tags: tuple[str, ...]
    created: str
    size: int
    inputs_hash: str
    base: str
    base_digest: str | None
    sparkctl_version: str | None
    pins: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tags": list(self.tags),
            "created": self.created,
            "size": self.size,
            "inputs_hash": self.inputs_hash,
            "base": self.base,
            "base_digest": self.base_digest,
            "sparkctl_version": self.sparkctl_version,
            "pins": self.pins,
        }


def _record(info: dict[str, Any]) -> ImageRecord:
    labels = (info.get("Config") or {}).get("Labels") or info.get("Labels") or {}
    created = info.get("Created", "")
    return ImageRecord(
        id=info["Id"],
        tags=tuple(info.get("RepoTags") or ()),
        created=str(created),
        size=int(info.get("Size") or 0),
        inputs_hash=labels.get(HASH_LABEL, ""),
        base=labels.get(BASE_LABEL, ""),
        base_digest=labels.get(BASE_DIGEST_LABEL),
        sparkctl_version=labels.get(VERSION_LABEL),
        pins={k[len(PIN_LABEL_PREFIX) :]: v for k, v in labels.items() if k.startswith(PIN_LABEL_PREFIX)},
    )


def list_images(client: Any) -> list[ImageRecord]:
    """sparkctl-built images, newest first."""
    rows = client.api.images(filters={"label": HASH_LABEL})
    out = [_record(client.api.inspect_image(row["Id"])) for row in rows]
    return sorted(out, key=lambda r: r.created, reverse=True)


def inspect(client: Any, ref: str) -> ImageRecord | None:
    from docker.errors import ImageNotFound

    try:
        return _record(client.api.inspect_image(ref))
    except ImageNotFound:
        return None


def ours(client: Any, ref: str) -> ImageRecord:
    rec = inspect(client, ref)
    if rec is None:
        raise UserError(f"no image {ref} on this machine", hint="sparkctl image ls")
    if not rec.inputs_hash:
        raise UserError(f"{ref} was not built by sparkctl build (no {HASH_LABEL} label); leaving it alone")
    return rec


def remove(client: Any, ref: str, *, force: bool = False) -> list[str]:
    """Remove one sparkctl-built image by tag or id; by id, every tag of it goes. Returns what went."""
    from docker.errors import APIError

    rec = ours(client, ref)
    targets = [ref] if ref in rec.tags else list(rec.tags)  # by id: every tag, then the image is gone
    gone: list[str] = []
    try:
        for target in targets or [rec.id]:
            client.api.remove_image(target, force=force)
            gone.append(target)
    except APIError as exc:
        raise RuntimeFailure(
            f"could not remove {ref}: {exc.explanation or exc}",
            hint="a container still uses it? sparkctl down, or --force",
        ) from None
    return gone


def save_to_host(client: Any, ref: str, host: str, *, ssh: str = "ssh", require_ours: bool = True) -> int:
    """Stream `docker save ref` into `ssh host docker load`; returns the bytes sent.

    `require_ours` False ships any local image (`sparkctl sync` gives the worker the recipe's image,
    which may be an upstream one)."""
    from docker.errors import APIError

    if require_ours:
        ours(client, ref)
    elif inspect(client, ref) is None:
        raise UserError(f"no image {ref} on this machine", hint="docker pull it or sparkctl build first")
    argv = [*shlex.split(ssh), host, "docker", "load"]
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
    except FileNotFoundError:
        raise UserError(f"{argv[0]} not found: saving to a host needs an ssh client") from None
    sent = 0
    assert proc.stdin is not None
    try:
        for chunk in client.api.get_image(ref, chunk_size=1 << 20):
            proc.stdin.write(chunk)
            sent += len(chunk)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    except APIError as exc:
        proc.kill()
        raise RuntimeFailure(f"docker save {ref} failed: {exc.explanation or exc}") from None
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.wait()
    if proc.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise RuntimeFailure(f"docker load on {host} failed (exit {proc.returncode}): {last}")
    return sent
