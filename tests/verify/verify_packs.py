"""Packs to verify and the corruptions planted in them: copies of the exllamav3-made fixtures and the tiny EXL3
models, rewritten the way a bad download, a bad copy or a hand-edited config would leave them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import exl3_real

from sparkctl.verify.reader import read_header


def fixture_copy(name: str, dest: Path) -> Path:
    """A writable copy of fixture `name`'s model directory."""
    reason = exl3_real.missing_reason(name)
    if reason:
        import pytest

        pytest.skip(reason)
    out = dest / name
    shutil.copytree(exl3_real.path(name) / "model", out)
    return out


def flip_word(model_dir: Path, tensor: str, index: int = 0) -> None:
    """Flip every bit of one int16 word of `tensor`, in place (the file keeps its size and header)."""
    for f in sorted(model_dir.glob("*.safetensors")):
        info = read_header(f).tensors.get(tensor)
        if info is None:
            continue
        with open(f, "r+b") as fh:
            fh.seek(info.start + 2 * index)
            word = fh.read(2)
            fh.seek(info.start + 2 * index)
            fh.write(bytes(b ^ 0xFF for b in word))
        return
    raise KeyError(tensor)


def rewrite(model_dir: Path, edit) -> None:  # noqa: ANN001 (a callable on the tensor dict)
    """Load every tensor of model.safetensors, let `edit` change the dict, write it back (metadata kept)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = model_dir / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata=meta)


def shard(model_dir: Path) -> dict[str, str]:
    """Split model.safetensors into two shards (layer 0 and embeddings / the rest) plus the index, as the hub
    ships a large pack. Returns the index's weight map."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(model_dir / "model.safetensors"))
    first = {k: v for k, v in tensors.items() if ".layers.0." in k or "embed" in k}
    rest = {k: v for k, v in tensors.items() if k not in first}
    names = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": rest}
    weight_map = {}
    for file, part in names.items():
        save_file(part, str(model_dir / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    (model_dir / "model.safetensors").unlink()
    (model_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return weight_map


def set_storage(model_dir: Path, module: str, **fields: object) -> None:
    """Edit one module's entry in quantization_config.json's tensor_storage."""
    path = model_dir / "quantization_config.json"
    q = json.loads(path.read_text())
    q["tensor_storage"][module].update(fields)
    path.write_text(json.dumps(q))
