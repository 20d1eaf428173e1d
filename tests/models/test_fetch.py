"""Model fetching against real files: a Hugging Face cache laid out the way huggingface_hub writes it,
local directories, and the real tiny-llama generator. Nothing here contacts the hub."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir

from sparkctl import paths
from sparkctl.errors import RuntimeFailure, UserError
from sparkctl.models import fetch
from sparkctl.models.generators import GENERATORS
from sparkctl.planner.types import ModelSource

REPO = "sparkctl-test/tiny-sharded"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHARDS = {
    "model-00001-of-00002.safetensors": b"A" * 3000,
    "model-00002-of-00002.safetensors": b"B" * 1000,
}


@pytest.fixture
def hf_cache(tmp_path) -> Path:
    """A populated HF cache: blobs named by content hash, a snapshot of symlinks, refs/main -> commit."""
    cache = tmp_path / "hf"
    repo_dir = cache / ("models--" + REPO.replace("/", "--"))
    blobs, snap = repo_dir / "blobs", repo_dir / "snapshots" / COMMIT
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    files = {
        **SHARDS,
        "config.json": json.dumps({"architectures": ["LlamaForCausalLM"]}).encode(),
        "model.safetensors.index.json": json.dumps(
            {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
        ).encode(),
    }
    for name, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        os.symlink(f"../../blobs/{digest}", snap / name)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(COMMIT)
    # huggingface_hub itself must recognise the layout, or this fixture proves nothing.
    info = scan_cache_dir(cache)
    assert [r.repo_id for r in info.repos] == [REPO]
    assert not info.warnings
    return cache


def test_offline_resolves_the_cached_snapshot_and_verifies_it(hf_cache):
    src = ModelSource(repo=REPO, expected_shards=2, expected_bytes=4000)
    got = fetch.resolve_model(src, offline=True, cache_dir=hf_cache)
    assert got == hf_cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    pinned = ModelSource(repo=REPO, revision=COMMIT, expected_shards=2)
    assert fetch.resolve_model(pinned, offline=True, cache_dir=hf_cache) == got
    assert fetch.local_model_path(pinned, cache_dir=hf_cache) == got
    assert [p.name for p in fetch.weight_files(got)] == list(SHARDS)


def test_wrong_shard_count_or_bytes_fail_with_a_resume_hint(hf_cache):
    with pytest.raises(RuntimeFailure, match="2 weight file.*expects 3") as info:
        fetch.resolve_model(ModelSource(repo=REPO, expected_shards=3), offline=True, cache_dir=hf_cache)
    assert "without --offline" in info.value.hint
    with pytest.raises(RuntimeFailure, match="total 4,000 bytes.*expects 4,001"):
        fetch.resolve_model(ModelSource(repo=REPO, expected_bytes=4001), offline=True, cache_dir=hf_cache)


def test_truncated_snapshot_missing_a_shard(hf_cache):
    snap = hf_cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    (snap / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(RuntimeFailure, match="missing"):
        fetch.resolve_model(ModelSource(repo=REPO), offline=True, cache_dir=hf_cache)


def test_missing_model_offline_is_a_clear_error(hf_cache):
    src = ModelSource(repo="sparkctl-test/not-downloaded", revision="main")
    assert fetch.local_model_path(src, cache_dir=hf_cache) is None
    with pytest.raises(
        RuntimeFailure, match=r"not-downloaded@main is not in the local Hugging Face cache"
    ) as info:
        fetch.resolve_model(src, offline=True, cache_dir=hf_cache)
    assert "without --offline" in info.value.hint
    other_rev = ModelSource(repo=REPO, revision="f" * 40)
    with pytest.raises(RuntimeFailure, match="--offline"):
        fetch.resolve_model(other_rev, offline=True, cache_dir=hf_cache)


def test_local_path(tmp_path):
    missing = ModelSource(path=str(tmp_path / "nope"))
    assert fetch.local_model_path(missing) is None
    with pytest.raises(UserError, match="does not exist"):
        fetch.resolve_model(missing)
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    with pytest.raises(RuntimeFailure, match="no model files"):
        fetch.resolve_model(ModelSource(path=str(d)))
    (d / "model.safetensors").write_bytes(b"x" * 10)
    assert fetch.resolve_model(ModelSource(path=str(d), expected_shards=1, expected_bytes=10)) == d.resolve()
    (d / "config.json").unlink()
    with pytest.raises(RuntimeFailure, match="no config.json"):
        fetch.resolve_model(ModelSource(path=str(d)))


def test_generate_tiny_llama_once_then_reuse():
    src = ModelSource(generate="tiny-llama")
    assert fetch.local_model_path(src) is None
    d = fetch.resolve_model(src)
    assert d == paths.generated_model_dir("tiny-llama")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(
        os.listdir(d)
    )
    assert oct(d.stat().st_mode & 0o777) != oct(0o700)  # readable by a container's user too
    assert [p.name for p in d.parent.iterdir()] == ["tiny-llama"]  # no temp dir left behind
    mtime = (d / "model.safetensors").stat().st_mtime_ns
    assert fetch.resolve_model(src) == d
    assert (d / "model.safetensors").stat().st_mtime_ns == mtime
    assert fetch.local_model_path(src) == d


def broken_generator(out_dir: Path) -> None:
    (out_dir / "config.json").write_text("{}")
    raise ValueError("disk full, say")


def test_failed_generator_leaves_nothing(monkeypatch):
    monkeypatch.setitem(GENERATORS, "broken", f"{__name__}:broken_generator")
    with pytest.raises(RuntimeFailure, match="'broken' failed: disk full"):
        fetch.resolve_model(ModelSource(generate="broken"))
    models = paths.generated_model_dir("broken").parent
    assert list(models.iterdir()) == []


def test_unknown_generator_lists_valid_names():
    with pytest.raises(UserError, match="unknown model generator 'nope'") as info:
        fetch.resolve_model(ModelSource(generate="nope"))
    assert "tiny-llama" in info.value.hint


def test_no_source_at_all():
    with pytest.raises(UserError, match="names no source"):
        fetch.resolve_model(ModelSource())


def test_a_model_from_an_older_generator_is_regenerated():
    src = ModelSource(generate="tiny-llama")
    d = fetch.resolve_model(src)
    marker = json.loads((d / fetch.MARKER).read_text())
    assert marker["fingerprint"] == fetch.generator_fingerprint("tiny-llama")
    # Pretend an older tiny.py wrote it: other fingerprint, and a file the current generator does not write.
    (d / fetch.MARKER).write_text(json.dumps({**marker, "fingerprint": "0" * 64}))
    (d / "left-over-from-old-version.txt").write_text("x")
    assert fetch.local_model_path(src) is None  # outdated counts as absent
    again = fetch.resolve_model(src)
    assert again == d
    assert not (d / "left-over-from-old-version.txt").exists()
    assert json.loads((d / fetch.MARKER).read_text())["fingerprint"] == marker["fingerprint"]
    assert [p.name for p in d.parent.iterdir()] == ["tiny-llama"]  # the old copy was removed
    # A directory from before markers existed is treated the same way.
    (d / fetch.MARKER).unlink()
    assert fetch.resolve_model(src) == d and (d / fetch.MARKER).is_file()


def test_fingerprint_follows_the_generator_source():
    assert fetch.generator_fingerprint("tiny-llama") == fetch.generator_fingerprint("tiny-llama")
    assert fetch.generator_fingerprint("tiny-llama") != fetch.generator_fingerprint("tiny-exl3-dense")
    with pytest.raises(UserError, match="unknown model generator"):
        fetch.generator_fingerprint("nope")


def test_fingerprint_covers_the_generators_import_closure():
    """The EXL3 generators' output depends on the tokenizer (tiny.py), the writer and the decoder it
    uses: all of them are hashed, not just the module that names the generator."""
    names = [m for m, _ in fetch.generator_sources("tiny-exl3-dense")]
    for needed in (
        "sparkctl.models.tiny_exl3",
        "sparkctl.models.tiny",
        "sparkctl_exl3.checkpoint",
        "sparkctl_exl3.reference",
    ):
        assert needed in names
    assert "torch" not in names and "tokenizers" not in names  # third-party code is not ours to hash


def test_an_edit_deep_in_the_closure_changes_the_fingerprint(tmp_path, monkeypatch):
    """A real generator package on disk: editing a module two imports away (relative, then absolute,
    inside a function) must give a new fingerprint, and so a regenerated model."""
    pkg = tmp_path / "fakegen"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "gen.py").write_text("from . import shapes\n\ndef make(out_dir):\n    shapes.write(out_dir)\n")
    (pkg / "shapes.py").write_text("def write(out_dir):\n    from fakegen.weights import SEED\n")
    (pkg / "weights.py").write_text("SEED = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(GENERATORS, "fake", "fakegen.gen:make")
    before = fetch.generator_fingerprint("fake")
    assert [m for m, _ in fetch.generator_sources("fake")] == [
        "fakegen",
        "fakegen.gen",
        "fakegen.shapes",
        "fakegen.weights",
    ]
    (pkg / "weights.py").write_text("SEED = 2\n")
    assert fetch.generator_fingerprint("fake") != before


@pytest.mark.slow
def test_local_model_path_of_an_uncached_repo_is_cheap(hf_cache, tmp_path):
    """`doctor` asks this for every hub recipe: a repo with no cache folder is answered without
    importing huggingface_hub's API client (~0.1 s), and a cached one is still found."""
    import subprocess
    import sys

    code = (
        "import sys; from sparkctl.models import fetch; from sparkctl.planner.types import ModelSource; "
        f"print(fetch.local_model_path(ModelSource(repo='nobody/absent'), cache_dir={str(hf_cache)!r})); "
        "print('huggingface_hub.hf_api' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["None", "False"]
    assert fetch.local_model_path(ModelSource(repo=REPO), cache_dir=hf_cache) is not None
