"""What the planner needs to know about this machine, gathered in one place before planning.

The planner (`build.make_plan`) is pure: it turns a typed Recipe and these Facts into a Plan, reading no
file and running nothing, so the same inputs always give the same plan and `render`, `--dry-run` and
`up` show the same command and the same mounts. Everything read here (the model directory, its GGUF
files, its config.json, the size of its weights, the host's memory, the stored API key file, the engine
binary installed here, the directories a prepared overlay's links and a mounted snapshot's links point
into) is read by `gather_facts`, which `up`'s validate stage (or `render`, `show`, `doctor`) calls first.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkctl.errors import RuntimeFailure
from sparkctl.planner.types import Mount
from sparkctl.recipe.schema import Recipe


@dataclass(frozen=True)
class Facts:
    model_dir: str | None = None  # the host directory (or file) holding the model; None: named by its repo
    model_present: bool = False  # model_dir exists now
    gguf_files: tuple[str, ...] = ()  # the .gguf files under model_dir (relative, sorted)
    model_config: dict[str, Any] | None = None  # its config.json (KV geometry)
    weights_bytes: int | None = None  # its weight files on disk
    host_memory_bytes: int = 0  # this host's RAM (the pool of a CPU engine)
    api_key_file: str | None = None  # the recipe's stored key file, when there is one
    entrypoint: tuple[str, ...] = ()  # the engine's command prefix as installed here
    overlay_link_roots: tuple[str, ...] = ()  # host dirs a prepare overlay's links point into
    link_mounts: tuple[Mount, ...] = ()  # read-only mounts that make links in mounted dirs resolve


def gather_facts(recipe: Recipe, model_path: str | None = None) -> Facts:
    """Read what planning `recipe` needs from this machine (`model_path`: the model already fetched)."""
    import dataclasses

    from sparkctl.planner import build, memory

    model_dir = build.local_dir(recipe, model_path)
    present = bool(model_dir) and Path(model_dir).exists()
    gguf: tuple[str, ...] = ()
    if present and recipe.model.format == "gguf" and Path(model_dir).is_dir():
        try:
            gguf = tuple(sorted(p.relative_to(model_dir).as_posix() for p in Path(model_dir).rglob("*.gguf")))
        except OSError:
            gguf = ()
    steps = build.prepare_steps(recipe)
    facts = Facts(
        model_dir=model_dir,
        model_present=present,
        gguf_files=gguf,
        model_config=memory.read_model_config(model_dir) if present else None,
        weights_bytes=memory.weights_on_disk(model_dir) if present else None,
        host_memory_bytes=memory.host_memory_bytes(),
        api_key_file=_api_key_file(recipe),
        entrypoint=tuple(build.default_entrypoint(recipe)),
        overlay_link_roots=tuple(_overlay_link_roots(recipe, steps.overlay))
        if steps is not None and recipe.runtime == "docker"
        else (),
    )
    mounts = build.container_mounts(recipe, facts)
    if not mounts:
        return facts
    try:
        links = link_target_mounts([(Path(m.source), m.target) for m in mounts])
    except RuntimeFailure:  # a link no mount can fix: planning still shows the plan, `start` refuses it
        links = []
    return dataclasses.replace(facts, link_mounts=tuple(Mount(h, c, read_only=True) for h, c in links))


def _api_key_file(recipe: Recipe) -> str | None:
    """The env file that hands the recipe's key to the engine, once `up` stored one (or the recipe names one)."""
    from sparkctl.paths import api_key_file

    path = api_key_file(recipe.name)
    return str(path) if recipe.serve.api_key_file or path.exists() else None


def _overlay_link_roots(recipe: Recipe, overlay_dir: str) -> list[str]:
    """Host directories the prepare overlay's links point into, mounted at their own path.

    From the overlay itself once it exists; before that, where the download will be: the repo's blob
    store in the mounted HF cache, or the local model directory.
    """
    from sparkctl.planner.build import abs_path

    overlay = Path(overlay_dir)
    if overlay.is_dir():
        roots = {str(Path(os.path.realpath(p)).parent) for p in overlay.rglob("*") if p.is_symlink()}
        return sorted(roots)
    m = recipe.model
    if m.repo and recipe.container.hf_cache:
        return [
            os.path.join(
                abs_path(recipe.container.hf_cache), "hub", "models--" + m.repo.replace("/", "--"), "blobs"
            )
        ]
    if m.path:
        return [os.path.realpath(abs_path(m.path))]
    return []


def link_target_mounts(binds: list[tuple[Path, str]], max_depth: int = 3) -> list[tuple[str, str]]:
    """Extra read-only (host dir, container dir) mounts that make symlinks in mounted dirs resolve.

    A Hugging Face snapshot directory holds relative links (`model.safetensors -> ../../blobs/<sha>`).
    Bind-mounted on its own, at /models/<name>, every link would dangle inside the container and the
    engine would fail to open its weights; mounting the blob directory where the links point fixes
    that without copying or re-linking anything. Links that already resolve to the same file through
    another mount (the whole HF cache mounted at its own path) need nothing.
    """
    extra: dict[str, Path] = {}

    def host_path_of(cpath: str) -> Path | None:
        table = [(t, src) for src, t in binds] + [(t, src) for t, src in extra.items()]
        best = None
        for target, src in table:
            t = target.rstrip("/") or "/"
            if (cpath == t or cpath.startswith(t.rstrip("/") + "/")) and (
                best is None or len(t) > len(best[0])
            ):
                best = (t, src)
        if best is None:
            return None
        rest = cpath[len(best[0]) :].lstrip("/")
        return Path(best[1]) / rest if rest else Path(best[1])

    for source, target in binds:
        if not source.is_dir():
            continue
        base_depth = len(source.parts)
        for dirpath, dirnames, filenames in os.walk(source):
            here = Path(dirpath)
            if len(here.parts) - base_depth >= max_depth:
                dirnames[:] = []
            for entry_name in filenames + dirnames:
                entry = here / entry_name
                if not entry.is_symlink():
                    continue
                real = entry.resolve()
                if not real.exists():
                    continue  # dangling on the host as well: not something a mount can fix
                rel_parent = here.relative_to(source).as_posix()
                cpath = posixpath.normpath(posixpath.join(target, rel_parent, os.readlink(entry)))
                seen = host_path_of(cpath)
                if seen is not None and seen.exists() and seen.resolve() == real:
                    continue
                cdir = posixpath.dirname(cpath)
                if (
                    posixpath.basename(cpath) != real.name
                    or extra.get(cdir, real.parent) != real.parent
                    or cdir == "/"
                ):
                    raise RuntimeFailure(
                        f"{entry} is a symlink that would not resolve inside the container ({cpath})",
                        hint="mount the directory it points into as well (container.mounts), or copy the files",
                    )
                extra[cdir] = real.parent
    return [(str(host), cdir) for cdir, host in extra.items()]
