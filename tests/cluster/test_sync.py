"""`sparkctl sync` against a real OpenSSH server on 127.0.0.2 (not "this machine" to sparkctl) and real
rsync: the worker's files live under its own sysroot, so the copy really crosses; a second run copies
nothing; a changed model is copied again; a full disk (a 1 MiB tmpfs), a refused key and a stopped sshd
each end in one line. The image part runs against a second Docker engine (its own socket and data root)
that the worker's SSH sessions reach through DOCKER_HOST, so `docker save | ssh docker load` really loads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sshd import Sshd, sshd_missing, start_sshd

from sparkctl.cluster.nodes import Node, NodeAuthRefused, NodeUnreachable, parse_node
from sparkctl.cluster.probe import ModelProbe
from sparkctl.errors import RuntimeFailure
from sparkctl.sync import image_ids, sync_image, sync_model

REPO = Path(__file__).resolve().parents[2]
ADDRESS = "127.0.0.2"
IMAGE = "sparkctl-test:cpu"


def _missing() -> str | None:
    return sshd_missing() or (None if shutil.which("rsync") else "needs rsync (make ssh-server)")


pytestmark = pytest.mark.skipif(bool(_missing()), reason=_missing() or "")


@pytest.fixture(scope="module")
def second_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """A second dockerd for "the worker" (None where dockerd or the test image is not here)."""
    if (
        not shutil.which("dockerd")
        or subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode
    ):
        yield None
        return
    root = Path("/tmp") / f"spk-d2-{os.getpid()}"  # a short path: the socket's must fit in 108 bytes
    root.mkdir()
    sock = f"unix://{root}/docker.sock"
    argv = ["dockerd", "--host", sock, "--data-root", f"{root}/data", "--exec-root", f"{root}/exec"]
    argv += ["--pidfile", f"{root}/pid", "--bridge", "none", "--iptables=false", "--ip6tables=false"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(root / "log", "wb"))  # noqa: SIM115
    env = {**os.environ, "DOCKER_HOST": sock}
    deadline = time.monotonic() + 30
    while subprocess.run(["docker", "info"], env=env, capture_output=True).returncode:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            yield None
            return
        time.sleep(0.5)
    try:
        yield sock
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def worker_hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The worker's own Hugging Face cache (its SSH sessions' HF_HUB_CACHE)."""
    return tmp_path_factory.mktemp("worker-home") / "hub"


@pytest.fixture(scope="module")
def sshd(
    tmp_path_factory: pytest.TempPathFactory, second_engine: str | None, worker_hub: Path
) -> Iterator[Sshd]:
    set_env = {"HF_HUB_CACHE": str(worker_hub)}
    if second_engine:
        set_env["DOCKER_HOST"] = second_engine
    server = start_sshd(tmp_path_factory.mktemp("sshd"), address=ADDRESS, set_env=set_env)
    yield server
    server.stop()


def worker(sshd: Sshd, root: Path | str = "") -> Node:
    node = parse_node(f"root@{ADDRESS}:{sshd.port}")
    return Node(node.address, node.host, node.user, node.port, sysroot=str(root))


HEAD = Node("localhost", "localhost")


def make_model(path: Path, shard: bytes = b"\x01" * 4096) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"model_type": "llama"}')
    (path / "model-00001-of-00001.safetensors").write_bytes(shard)
    index = {"weight_map": {"w": "model-00001-of-00001.safetensors"}, "v": hashlib.sha256(shard).hexdigest()}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return path


@pytest.mark.slow
def test_copies_once_then_nothing(sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKCTL_SSH_OPTS", sshd.opts())
    model = make_model(tmp_path / "models" / "tiny")
    wroot = tmp_path / "worker"
    req = ModelProbe(str(model))
    first = sync_model(HEAD, worker(sshd, wroot), req)
    assert first.action == "copied" and first.detail.startswith("missing;") and "(verified)" in first.detail
    assert first.bytes_sent > 4096
    copy = wroot / str(model).lstrip("/")
    assert (copy / "model-00001-of-00001.safetensors").read_bytes() == b"\x01" * 4096
    again = sync_model(HEAD, worker(sshd, wroot), req)
    assert again.action == "in sync" and "nothing copied" in again.detail
    make_model(model, shard=b"\x02" * 8192)  # the head's model changed (a new revision)
    changed = sync_model(HEAD, worker(sshd, wroot), req)
    assert changed.action == "copied" and "index file hash" in changed.detail
    assert (copy / "model-00001-of-00001.safetensors").read_bytes() == b"\x02" * 8192


@pytest.mark.slow
def test_hub_cache_keeps_its_links(sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKCTL_SSH_OPTS", sshd.opts())
    repo = tmp_path / "hub" / "models--org--tiny"
    rev = "a" * 40
    blobs = make_model(repo / "blobs-src")
    (repo / "blobs").mkdir()
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    for f in blobs.iterdir():
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        f.rename(repo / "blobs" / digest)
        (snap / f.name).symlink_to(f"../../blobs/{digest}")
    blobs.rmdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    wroot = tmp_path / "worker"
    part = sync_model(HEAD, worker(sshd, wroot), ModelProbe(str(repo), "main"))
    assert part.action == "copied" and f"rev {rev[:12]}" in part.detail
    link = wroot / str(snap).lstrip("/") / "config.json"
    assert link.is_symlink() and link.read_text() == '{"model_type": "llama"}'


@pytest.mark.slow
def test_no_space_is_one_line(sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKCTL_SSH_OPTS", sshd.opts())
    model = make_model(tmp_path / "big", shard=os.urandom(4 << 20))
    wroot = tmp_path / "small"
    wroot.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(wroot)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(RuntimeFailure, match=r"no space for the model: 4\.0 MiB to copy, 1\.0 MiB free"):
            sync_model(HEAD, worker(sshd, wroot), ModelProbe(str(model)))
        assert not any(wroot.rglob("*.safetensors"))
    finally:
        subprocess.run(["umount", str(wroot)], check=True)


@pytest.mark.slow
def test_refused_and_unreachable(sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_model(tmp_path / "m")
    monkeypatch.setenv("SPARKCTL_SSH_OPTS", sshd.opts(sshd.other_key))
    with pytest.raises(NodeAuthRefused, match="SSH refused the login"):
        sync_model(HEAD, worker(sshd, tmp_path / "w"), ModelProbe(str(model)))
    gone = start_sshd(tmp_path / "gone", address=ADDRESS)
    gone.stop()
    monkeypatch.setenv("SPARKCTL_SSH_OPTS", gone.opts())
    with pytest.raises(NodeUnreachable, match="unreachable over SSH"):
        sync_model(HEAD, worker(gone, tmp_path / "w"), ModelProbe(str(model)))


@pytest.mark.slow
def test_image_loaded_when_the_digest_differs(
    sshd: Sshd, second_engine: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if second_engine is None:
        pytest.skip("needs dockerd and the sparkctl-test:cpu image (make test-image)")
    monkeypatch.setenv("SPARKCTL_SSH_OPTS", sshd.opts())
    w = worker(sshd)
    env = {**os.environ, "DOCKER_HOST": second_engine}
    subprocess.run(["docker", "rmi", "-f", IMAGE], env=env, capture_output=True)
    here, there = image_ids(HEAD, w, IMAGE)
    assert here and there is None
    loaded = sync_image(HEAD, w, IMAGE)
    assert loaded.action == "copied" and loaded.detail.startswith("missing;") and loaded.bytes_sent > 1 << 20
    assert image_ids(HEAD, w, IMAGE) == (here, here)
    assert sync_image(HEAD, w, IMAGE).action == "in sync"


def _hub_repo(hub: Path, files: Path, rev: str) -> Path:
    """A Hugging Face cache entry for `org/tiny` made from a local model dir (blobs + snapshot links)."""
    repo = hub / "models--org--tiny"
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in sorted(files.iterdir()):
        if f.is_file():
            digest = hashlib.sha256(f.read_bytes()).hexdigest()
            shutil.copyfile(f, repo / "blobs" / digest)
            (snap / f.name).symlink_to(f"../../blobs/{digest}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    return repo


@pytest.mark.slow
def test_cli_copies_a_hub_model_once(sshd: Sshd, worker_hub: Path, tmp_path: Path) -> None:
    """Through the CLI: a hub-repo recipe; the worker's SSH sessions have their own HF_HUB_CACHE
    (sshd SetEnv), so the copy crosses for real; a second run copies nothing; a refused key is one line."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'kernels'}", "SPARKCTL_SSH_OPTS": sshd.opts()}
    make = (
        "from sparkctl.models.fetch import resolve_weights; from sparkctl.plans import load_and_plan; "
        "r, p = load_and_plan('tiny'); print(resolve_weights(p.model)[0])"
    )
    made = subprocess.run([sys.executable, "-c", make], env=env, capture_output=True, text=True, check=True)
    rev = "0123456789abcdef" * 2 + "01234567"
    _hub_repo(tmp_path / "hub", Path(made.stdout.strip().splitlines()[-1]), rev)
    env.update(HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    recipe = tmp_path / "tiny-hub.yaml"
    recipe.write_text(
        "extends: tiny\nname: tiny-hub\nmodel: {generate: null, repo: org/tiny, revision: main}\n"
    )
    argv = [sys.executable, "-m", "sparkctl", "sync", str(recipe), "--to", f"root@{ADDRESS}:{sshd.port}"]
    dry = subprocess.run([*argv, "--dry-run"], env=env, capture_output=True, text=True)
    assert dry.returncode == 0 and "model: would copy: missing;" in dry.stdout, dry.stderr
    first = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert (
        f"model: copied: missing; copied to root@{ADDRESS}:{sshd.port}: {worker_hub}/models--org--tiny"
        in first.stdout
    )
    assert f"rev {rev[:12]}" in first.stdout and "(verified)" in first.stdout
    config = worker_hub / "models--org--tiny" / "snapshots" / rev / "config.json"
    assert (
        config.is_symlink()
        and config.read_bytes()
        == (tmp_path / "hub" / "models--org--tiny" / "snapshots" / rev / "config.json").read_bytes()
    )
    second = subprocess.run([*argv, "--json"], env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    result = json.loads(second.stdout)
    assert result["copied"] is False and result["parts"][0]["action"] == "in sync"
    env["SPARKCTL_SSH_OPTS"] = sshd.opts(sshd.other_key)
    bad = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and "SSH refused the login" in bad.stderr and "Traceback" not in bad.stderr
    assert len([ln for ln in bad.stderr.splitlines() if ln.startswith("error")]) == 1
