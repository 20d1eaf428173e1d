"""What goes into an image, and the content hash that names it.

The tag of a built image is a hash of every input (each file of the build context, the Dockerfile, the
build args, the labels, the base image's id and sparkctl's version), so "is it up to date?" is one
lookup: an image with that tag exists or it does not. No timestamps, no "latest", nothing that changes
when a base tag is re-pushed upstream without its id changing here.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path

from sparkctl import __version__
from sparkctl.errors import UserError

HASH_LABEL = "io.sparkctl.inputs-hash"
BASE_LABEL = "io.sparkctl.base-image"
BASE_ID_LABEL = "io.sparkctl.base-id"
BASE_DIGEST_LABEL = "io.sparkctl.base-digest"
VERSION_LABEL = "io.sparkctl.version"
HASH_CHARS = 12


@dataclass(frozen=True)
class BuildSpec:
    """One image to build: `repository:<prefix>-<hash>` is its tag, `alias` the name recipes use."""

    context: Path
    dockerfile: str  # relative to context, e.g. docker/Dockerfile
    repository: str  # e.g. sparkctl/vllm-exl3
    prefix: str  # readable part of the tag, e.g. 0.33.0-sm121
    base: str  # the FROM image (passed as the BASE_IMAGE build arg)
    alias: str | None = None  # also tagged with this (the recipe's container.image)
    build_args: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    ignore_file: str | None = None  # relative to context; BuildKit's <Dockerfile>.dockerignore convention

    def dockerfile_path(self) -> Path:
        return self.context / self.dockerfile

    def ignore_patterns(self) -> list[str]:
        """The ignore file's patterns (comments and blanks dropped); none when there is no file."""
        name = self.ignore_file or ".dockerignore"
        path = self.context / name
        if not path.is_file():
            return []
        lines = (ln.strip() for ln in path.read_text().splitlines())
        return [ln for ln in lines if ln and not ln.startswith("#")]

    def files(self) -> list[str]:
        """The context's files (relative, sorted) after the ignore rules: exactly what the engine sees."""
        from docker.utils.build import exclude_paths

        if not self.dockerfile_path().is_file():
            raise UserError(f"no Dockerfile at {self.dockerfile_path()}")
        paths = exclude_paths(str(self.context), self.ignore_patterns(), dockerfile=self.dockerfile)
        return sorted(p for p in paths if (self.context / p).is_file())

    def tar(self, files: list[str] | None = None) -> io.BytesIO:
        """The build context as an uncompressed tar of exactly `files()` (the list the hash covers);
        docker-py reads only a top-level .dockerignore, so the context is made here and sent as is."""
        from docker.utils.build import create_archive

        f = create_archive(str(self.context), files=files if files is not None else self.files())
        return io.BytesIO(f.read())


def input_hash(spec: BuildSpec, base_id: str, files: list[str] | None = None) -> str:
    """sha256 over everything that decides what the image contains."""
    h = hashlib.sha256()

    def put(*parts: str) -> None:
        for part in parts:
            h.update(part.encode())
            h.update(b"\0")

    put("sparkctl", __version__, "dockerfile", spec.dockerfile, "base", base_id)
    for key, value in sorted(spec.build_args.items()):
        put("arg", key, value)
    for key, value in sorted(spec.labels.items()):
        put("label", key, value)
    for rel in files if files is not None else spec.files():
        put("file", rel, hashlib.sha256((spec.context / rel).read_bytes()).hexdigest())
    return h.hexdigest()


def tag_for(spec: BuildSpec, digest: str) -> str:
    return f"{spec.repository}:{spec.prefix}-{digest[:HASH_CHARS]}"


@dataclass(frozen=True)
class Instruction:
    line: int  # 1-based line of the Dockerfile where it starts
    text: str  # the instruction, continuation lines joined


def instructions(dockerfile_text: str) -> list[Instruction]:
    """The Dockerfile's instructions in order (the classic builder's "Step N/M" counts these), so a failed
    step can be reported with the line it came from."""
    out: list[Instruction] = []
    start, buf = 0, ""
    for n, raw in enumerate(dockerfile_text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # comments inside a continued instruction are dropped by the parser too
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1].strip() + " "
            continue
        out.append(Instruction(start, (buf + line).strip()))
        buf = ""
    if buf:
        out.append(Instruction(start, buf.strip()))
    return out
