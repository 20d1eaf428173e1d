"""Drive one image build on the Docker engine and report it as records.

The core yields `BuildEvent`s (a step started, a step came from cache, a log line) to a callback and
returns a `BuildResult`; the CLI renders them. A build whose inputs hash to an existing tag is not run at
all. A failing step raises `BuildFailed` with the step, its Dockerfile line and the last lines of its
log, so the user sees the one thing that broke instead of a scrollback of pip output.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from sparkctl import __version__
from sparkctl.errors import RuntimeFailure, UserError
from sparkctl.image.context import (
    BASE_DIGEST_LABEL,
    BASE_ID_LABEL,
    BASE_LABEL,
    HASH_LABEL,
    VERSION_LABEL,
    BuildSpec,
    Instruction,
    input_hash,
    instructions,
    tag_for,
)

TAIL_LINES = 20
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_EXIT = re.compile(r"returned a non-zero code: (\d+)")


@dataclass(frozen=True)
class BuildEvent:
    kind: Literal["step", "cached", "log"]
    step: int
    total: int
    text: str  # the instruction (step), or a log line


@dataclass(frozen=True)
class BaseImage:
    ref: str
    id: str
    digest: str | None  # repo digest when the base came from a registry; None for a local import


@dataclass
class BuildResult:
    tag: str
    alias: str | None
    image_id: str
    inputs_hash: str
    base: BaseImage
    built: bool  # False: an image with these inputs already existed and was reused
    seconds: float = 0.0
    steps: int = 0
    cached_steps: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "alias": self.alias,
            "image_id": self.image_id,
            "inputs_hash": self.inputs_hash,
            "base": {"ref": self.base.ref, "id": self.base.id, "digest": self.base.digest},
            "built": self.built,
            "seconds": round(self.seconds, 1),
            "steps": self.steps,
            "cached_steps": self.cached_steps,
        }


class BuildFailed(RuntimeFailure):
    """A Dockerfile step failed: what it was, where it is, and the end of its output."""

    def __init__(self, message: str, *, step: Instruction | None, tail: list[str], hint: str | None = None):
        super().__init__(message, hint=hint)
        self.step = step
        self.tail = tail


def resolve_base(client: Any, ref: str) -> BaseImage:
    """The base image as this engine has it; never pulled implicitly (it is tens of GB on a Spark, and
    the id that goes into the tag must be the one that was inspected)."""
    from docker.errors import APIError, ImageNotFound

    try:
        info = client.api.inspect_image(ref)
    except ImageNotFound:
        raise UserError(
            f"base image {ref} is not on this machine",
            hint=f"pull it (docker pull {ref}) or choose another with --base IMAGE (see docker/README.md)",
        ) from None
    except APIError as exc:
        raise RuntimeFailure(f"could not inspect base image {ref}: {exc.explanation or exc}") from None
    digests = info.get("RepoDigests") or []
    return BaseImage(ref=ref, id=info["Id"], digest=digests[0] if digests else None)


def existing(client: Any, tag: str) -> str | None:
    from docker.errors import ImageNotFound

    try:
        return str(client.api.inspect_image(tag)["Id"])
    except ImageNotFound:
        return None


def build(
    spec: BuildSpec,
    client: Any,
    *,
    nocache: bool = False,
    network_mode: str = "host",
    check_only: bool = False,
    on_event: Callable[[BuildEvent], None] | None = None,
) -> BuildResult:
    """Build `spec` unless an image with the same inputs exists; tag the alias either way. `check_only`
    builds nothing: the result says whether an image with these inputs exists (image_id empty if not)."""
    emit = on_event or (lambda _e: None)
    base = resolve_base(client, spec.base)
    files = spec.files()
    digest = input_hash(spec, base.id, files)
    tag = tag_for(spec, digest)
    found = existing(client, tag)
    if check_only:
        return BuildResult(tag, spec.alias, found or "", digest, base, built=False)
    if found and not nocache:
        _alias(client, found, spec.alias)
        return BuildResult(tag, spec.alias, found, digest, base, built=False)

    labels = {
        **spec.labels,
        HASH_LABEL: digest,
        BASE_LABEL: spec.base,
        BASE_ID_LABEL: base.id,
        VERSION_LABEL: __version__,
    }
    if base.digest:
        labels[BASE_DIGEST_LABEL] = base.digest
    steps = instructions(spec.dockerfile_path().read_text())
    t0 = time.monotonic()
    result = BuildResult(tag, spec.alias, "", digest, base, built=True)
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    current = 0
    try:
        stream = client.api.build(
            fileobj=spec.tar(files),
            custom_context=True,
            dockerfile=spec.dockerfile,
            tag=tag,
            buildargs={"BASE_IMAGE": spec.base, **spec.build_args},
            labels=labels,
            nocache=nocache,
            pull=False,
            rm=True,
            forcerm=True,
            decode=True,
            timeout=None,  # a step may print nothing for many minutes (nvcc, a big wheel)
            # RUN steps fetch wheels: the host's network works where the engine has no bridge (CI here)
            network_mode=network_mode,
        )
        pending = ""  # the engine splits output anywhere; events are whole lines
        for item in stream:
            if "error" in item or "errorDetail" in item:
                message = (item.get("errorDetail") or {}).get("message") or item.get("error") or "failed"
                if pending.strip():
                    tail.append(pending.rstrip())
                raise _failure(message.strip(), current, result.steps, steps, list(tail))
            pending += _ANSI.sub("", str(item.get("stream", "")))
            *lines, pending = pending.split("\n")
            for line in lines:
                m = _STEP.match(line)
                if m:
                    current, result.steps = int(m.group(1)), int(m.group(2))
                    tail.clear()
                    emit(BuildEvent("step", current, result.steps, m.group(3)))
                elif line.strip() == "---> Using cache":
                    result.cached_steps.append(current)
                    emit(BuildEvent("cached", current, result.steps, line.strip()))
                elif line.strip() and not line.startswith((" ---> ", "Removing intermediate container")):
                    tail.append(line.rstrip())
                    emit(BuildEvent("log", current, result.steps, line.rstrip()))
    except BuildFailed:
        raise
    except Exception as exc:  # the engine refused the build or went away mid-stream
        import requests
        from docker.errors import APIError

        if isinstance(exc, APIError):
            raise RuntimeFailure(f"the Docker engine refused the build: {exc.explanation or exc}") from None
        if isinstance(exc, requests.RequestException):
            raise RuntimeFailure(f"lost the Docker engine during the build: {exc}") from None
        raise
    result.seconds = time.monotonic() - t0
    result.image_id = existing(client, tag) or ""
    if not result.image_id:
        raise RuntimeFailure(f"the build ended without an image {tag}", hint="see the engine's log")
    _alias(client, result.image_id, spec.alias)
    if found and found != result.image_id:
        _drop_untagged(client, found)  # a --no-cache rebuild took the tag from it
    return result


def _drop_untagged(client: Any, image_id: str) -> None:
    from docker.errors import APIError

    try:
        if not client.api.inspect_image(image_id).get("RepoTags"):
            client.api.remove_image(image_id)
    except APIError:
        pass  # still used by a container, or already gone: nothing to tidy


def _failure(
    message: str, current: int, total: int, steps: list[Instruction], tail: list[str]
) -> BuildFailed:
    step = steps[current - 1] if 0 < current <= len(steps) else None
    where = f"step {current}/{total}" if current else "before the first step"
    if step is not None:
        where += f" (Dockerfile line {step.line}, {step.text.split(None, 1)[0]})"
    code = _EXIT.search(message)
    if code:  # the engine repeats the whole command; the line above shows it once
        message = f"it exited with code {code.group(1)}"
    return BuildFailed(f"image build failed at {where}: {message}", step=step, tail=tail)


def _alias(client: Any, image_id: str, alias: str | None) -> None:
    if alias:
        repo, _, tag = alias.rpartition(":") if ":" in alias.rsplit("/", 1)[-1] else (alias, "", "latest")
        client.api.tag(image_id, repo, tag, force=True)


def push(client: Any, tag: str, registry: str, on_line: Callable[[str], None] | None = None) -> str:
    """Tag `tag` under `registry/` and push it; returns the pushed reference. A failed push leaves no
    registry tag behind."""
    from docker.errors import APIError

    target = f"{registry.rstrip('/')}/{tag}"
    repo, _, version = target.rpartition(":")
    try:
        client.api.tag(tag, repo, version, force=True)
        for item in client.api.push(repo, version, stream=True, decode=True):
            if "error" in item or "errorDetail" in item:
                message = (item.get("errorDetail") or {}).get("message") or item.get("error")
                raise RuntimeFailure(f"push to {registry} failed: {str(message).strip()}")
            if on_line and item.get("status"):
                on_line(f"{item.get('id', '')} {item['status']}".strip())
    except (APIError, RuntimeFailure) as exc:
        with contextlib.suppress(APIError):
            client.api.remove_image(target)
        if isinstance(exc, RuntimeFailure):
            raise
        raise RuntimeFailure(f"push to {registry} failed: {exc.explanation or exc}") from None
    return target
