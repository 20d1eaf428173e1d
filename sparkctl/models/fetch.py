"""Put a recipe's model on local disk and prove it is complete before a server is asked to load it.

Three sources, one answer (a local directory):
- `repo`: `huggingface_hub.snapshot_download` at the pinned revision into the standard HF cache, so
  other tools share the download and an interrupted one resumes; `offline` uses the cache only.
- `path`: a directory the user already has.
- `generate`: a named generator (sparkctl.models.generators) writes the model on first use into a temp
  directory next to its final place, then renames it, so a half-written model is never reused.

Then the weight files are counted and sized against the recipe (`expected_shards`, `expected_bytes`):
a truncated download fails here with one line instead of minutes later inside the engine.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from sparkctl import paths
from sparkctl.errors import RuntimeFailure, UserError
from sparkctl.models.generators import GENERATORS
from sparkctl.models.source import ModelSource


def resolve_model(source: ModelSource, *, offline: bool = False, cache_dir: str | Path | None = None) -> Path:
    """The local directory holding `source`, downloading or generating it if needed, then verified.

    `cache_dir` overrides the Hugging Face cache (default: HF_HUB_CACHE / HF_HOME rules).
    """
    return resolve_weights(source, offline=offline, cache_dir=cache_dir)[0]


def resolve_weights(
    source: ModelSource, *, offline: bool = False, cache_dir: str | Path | None = None
) -> tuple[Path, list[Path]]:
    """resolve_model's directory and its weight files in loader order, from the one listing that verified them."""
    if source.repo:
        model_dir = _download(source, offline=offline, cache_dir=cache_dir)
    elif source.path:
        model_dir = _local(source)
    elif source.generate:
        model_dir = _generate(source.generate)
    else:
        raise UserError("the recipe's model names no source: set model.repo, model.path or model.generate")
    return model_dir, verify_model_dir(model_dir, source)


def local_model_path(source: ModelSource, *, cache_dir: str | Path | None = None) -> Path | None:
    """Where the model already is on this machine, or None; never touches the network or writes."""
    if source.repo:
        if not _repo_cache_folder(source.repo, cache_dir).is_dir():
            return None  # nothing cached: answer without importing hf_api (~0.1 s of `doctor`)
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            return _snapshot(source, cache_dir=cache_dir, local_files_only=True)
        except (LocalEntryNotFoundError, FileNotFoundError, ValueError, OSError):
            return None
    if source.path:
        p = Path(source.path).expanduser()
        return p if p.is_dir() else None
    if source.generate:
        p = paths.generated_model_dir(source.generate)
        return p if p.is_dir() and _is_current(p, generator_fingerprint(source.generate)) else None
    return None


def _repo_cache_folder(repo: str, cache_dir: str | Path | None) -> Path:
    """The hub cache's folder for a model repo (`models--owner--name`), per huggingface_hub's layout."""
    from huggingface_hub import constants

    sep = constants.REPO_ID_SEPARATOR
    return Path(cache_dir or constants.HF_HUB_CACHE) / f"models{sep}{repo.replace('/', sep)}"


def weight_files(model_dir: Path) -> list[Path]:
    """The files a loader reads (prewarm's definition, shared so warm-up and checks agree)."""
    from prewarm import PrewarmError, model_files

    try:
        return model_files(model_dir)
    except PrewarmError as exc:
        raise RuntimeFailure(str(exc), hint=getattr(exc, "hint", None)) from exc


def verify_model_dir(model_dir: Path, source: ModelSource) -> list[Path]:
    """Check the directory holds loadable weights matching the recipe's shard count and byte total."""
    files = weight_files(model_dir)
    where = source.repo or source.path or source.generate or str(model_dir)
    if source.format != "gguf" and not (model_dir / "config.json").is_file():
        raise RuntimeFailure(
            f"model {where}: {model_dir} has no config.json",
            hint="point model.path at a Hugging Face style model directory",
        )
    if source.expected_shards is not None and len(files) != source.expected_shards:
        raise RuntimeFailure(
            f"model {where}: {len(files)} weight file(s) in {model_dir}, the recipe expects {source.expected_shards}",
            hint=_incomplete_hint(source),
        )
    total = sum(f.stat().st_size for f in files)
    if source.expected_bytes is not None and total != source.expected_bytes:
        raise RuntimeFailure(
            f"model {where}: weight files total {total:,} bytes in {model_dir}, the recipe expects "
            f"{source.expected_bytes:,}",
            hint=_incomplete_hint(source),
        )
    return files


def _incomplete_hint(source: ModelSource) -> str:
    if source.repo:
        return (
            "the download is incomplete or the revision differs from the recipe's pin; "
            "run `sparkctl up` again without --offline to resume it"
        )
    return "the model directory does not match the recipe (model.expected_shards / model.expected_bytes)"


def _snapshot(source: ModelSource, *, cache_dir: str | Path | None, local_files_only: bool) -> Path:
    """The recipe's snapshot (repo, revision pin, allow_patterns) in the HF cache: what `up` downloads
    and what `doctor` / `prewarm` look for must be the same files."""
    from huggingface_hub import snapshot_download

    found = snapshot_download(
        source.repo,
        revision=source.revision,
        allow_patterns=list(source.allow_patterns) or None,
        cache_dir=cache_dir,
        local_files_only=local_files_only,
    )
    return Path(found)


def _download(source: ModelSource, *, offline: bool, cache_dir: str | Path | None) -> Path:
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    name = f"{source.repo}@{source.revision}" if source.revision else source.repo
    try:
        return _snapshot(source, cache_dir=cache_dir, local_files_only=offline)
    except GatedRepoError as exc:
        raise RuntimeFailure(
            f"model {name} is gated and this machine's Hugging Face token cannot read it",
            hint="accept the licence on the model page, then `hf auth login` or set HF_TOKEN",
        ) from exc
    except RevisionNotFoundError as exc:
        raise UserError(
            f"model {name}: revision {source.revision!r} does not exist",
            hint="fix model.revision in the recipe",
        ) from exc
    except RepositoryNotFoundError as exc:
        raise UserError(
            f"model {source.repo}: no such repository (or it is private)",
            hint="check model.repo; for a private repo set HF_TOKEN",
        ) from exc
    except LocalEntryNotFoundError as exc:
        if offline:
            raise RuntimeFailure(
                f"model {name} is not in the local Hugging Face cache and --offline forbids downloading",
                hint="run once without --offline (downloads resume), or copy the snapshot into the HF cache",
            ) from exc
        raise RuntimeFailure(
            f"model {name}: the Hugging Face hub is unreachable and the model is not cached",
            hint="check the network (HF_ENDPOINT, proxy), or download it on another machine into the HF cache",
        ) from exc
    except HfHubHTTPError as exc:
        raise RuntimeFailure(
            f"model {name}: download failed: {exc}", hint="run `sparkctl up` again to resume"
        ) from exc
    except OSError as exc:
        raise RuntimeFailure(
            f"model {name}: download failed: {exc}",
            hint="check free disk space in the HF cache (HF_HOME), then run again to resume",
        ) from exc


def _local(source: ModelSource) -> Path:
    assert source.path is not None
    p = Path(source.path).expanduser()
    if not p.exists():
        raise UserError(f"model.path {p} does not exist", hint="fix model.path in the recipe")
    if not p.is_dir():
        raise UserError(
            f"model.path {p} is not a directory", hint="point model.path at the model's directory"
        )
    return p.resolve()


MARKER = ".sparkctl-generated.json"


def generator_fingerprint(name: str) -> str:
    """Hash of the generator's spec and the source of every module it runs: a change anywhere in that
    closure (the tokenizer it shares, the EXL3 writer and the decoder behind it) means a stale model.

    Read from the files, not by importing them (the EXL3 writers import torch), so checking is cheap.
    """
    spec = _generator_spec(name)
    digest = hashlib.sha256(spec.encode())
    for module_name, path in generator_sources(name):
        digest.update(f"\0{module_name}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _generator_spec(name: str) -> str:
    spec = GENERATORS.get(name)
    if spec is None:
        raise UserError(
            f"unknown model generator {name!r}", hint=f"model.generate must be one of: {valid_generators()}"
        )
    return spec


def valid_generators() -> str:
    return ", ".join(sorted(GENERATORS))


def generator_sources(name: str) -> list[tuple[str, Path]]:
    """(module, source file) of the generator's module and of every first-party module it imports, at any
    depth, sorted: the generator's own top-level package plus sparkctl's and the plugin's.

    Imports are read from the syntax tree (absolute and relative, at module level or inside functions),
    so nothing is executed; a name that is not a module (`from pkg import function`) is its package.
    """
    root = _generator_spec(name).split(":")[0]
    first_party = {root.split(".")[0], "sparkctl", "sparkctl_exl3"}
    seen: dict[str, Path] = {}
    todo = [root]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        path = _module_file(module)
        if path is None:
            continue
        seen[module] = path
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages run first
        is_package = path.name == "__init__.py"
        for imported in _imports_of(path, module, is_package):
            if imported.split(".")[0] in first_party:
                todo.append(imported)
    return sorted(seen.items())


def _module_file(module: str) -> Path | None:
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if (
        found is None
        or not found.origin
        or not found.origin.endswith(".py")
        or not os.path.isfile(found.origin)
    ):
        return None
    return Path(found.origin)


def _imports_of(path: Path, module: str, is_package: bool) -> list[str]:
    import ast

    package = module if is_package else module.rpartition(".")[0]
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            out.append(prefix)
            out += [f"{prefix}.{alias.name}" for alias in node.names if alias.name != "*"]
    return [m for m in out if m]


def _is_current(target: Path, fingerprint: str) -> bool:
    try:
        marker = json.loads((target / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("fingerprint") == fingerprint


def _generate(name: str) -> Path:
    """Run the named generator once; later calls reuse its output while the generator is unchanged.

    The output appears by a rename, so a directory at the target is always complete; its marker file
    records which generator version wrote it, and an outdated one is regenerated and swapped in.
    """
    target = paths.generated_model_dir(name)
    fingerprint = generator_fingerprint(name)
    if target.is_dir() and _is_current(target, fingerprint):
        return target
    spec = GENERATORS[name]
    module_name, attr = spec.split(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise RuntimeFailure(
            f"model generator {name!r} ({spec}) is not available: {exc}",
            hint="install what it needs (make install-vllm brings torch, tokenizers and safetensors)",
        ) from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=target.parent))
    try:
        fn(tmp)
        (tmp / MARKER).write_text(
            json.dumps({"generator": name, "spec": spec, "fingerprint": fingerprint}) + "\n"
        )
        _share(tmp)
        if target.is_dir():  # an outdated copy: move it aside first (a server may still read it)
            old = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".old", dir=target.parent))
            os.rename(target, old / "model")
            os.rename(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            try:
                os.rename(tmp, target)
            except OSError:
                if not target.is_dir():  # a concurrent `up` finished first: use its copy
                    raise
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, Exception) and not isinstance(exc, RuntimeFailure | UserError):
            raise RuntimeFailure(f"model generator {name!r} failed: {exc}") from exc
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    return target


def _share(directory: Path) -> None:
    """mkdtemp makes 0700 and some writers 0600; a model is read by containers and other users too."""
    umask = os.umask(0)
    os.umask(umask)
    for root, dirs, files in os.walk(directory):
        for d in dirs:
            os.chmod(Path(root) / d, 0o777 & ~umask)
        for f in files:
            os.chmod(Path(root) / f, 0o666 & ~umask)
    os.chmod(directory, 0o777 & ~umask)
