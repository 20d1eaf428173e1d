"""`sparkctl build`'s core on the real local engine: the content-hash tag and when it rebuilds, a missing
base, a failing step, and the image commands. Tiny contexts on the local test image: seconds, not GB."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dockerkit import REPO

from sparkctl.errors import RuntimeFailure, UserError
from sparkctl.image.build import BuildFailed, build, push
from sparkctl.image.context import HASH_LABEL, BuildSpec
from sparkctl.image.store import list_images, remove, save_to_host

pytestmark = pytest.mark.docker
REPOSITORY = "sparkctl-imagetest/tiny"


def sparkctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'kernels'}"}
    return subprocess.run(
        [sys.executable, "-m", "sparkctl", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.fixture
def cleanup(docker_client):
    """Remove every image these tests tagged (and the layers only they used)."""
    yield
    for row in docker_client.api.images(name="sparkctl-imagetest/*"):
        for tag in row.get("RepoTags") or []:
            docker_client.api.remove_image(tag, force=True)


def tiny_context(root: Path, run: str = "cat /app/a.txt") -> Path:
    (root / "app").mkdir(parents=True, exist_ok=True)
    (root / "app" / "a.txt").write_text("one\n")
    (root / "app" / "ignored.log").write_text("not part of the image\n")
    (root / "Dockerfile").write_text(f"ARG BASE_IMAGE\nFROM ${{BASE_IMAGE}}\nCOPY app/ /app/\nRUN {run}\n")
    (root / "Dockerfile.dockerignore").write_text("# only what the image copies\n**/*.log\n")
    return root


def spec_for(ctx: Path, base: str, **kw) -> BuildSpec:
    return BuildSpec(
        context=ctx,
        dockerfile="Dockerfile",
        repository=REPOSITORY,
        prefix="t",
        base=base,
        alias=f"{REPOSITORY}:alias",
        ignore_file="Dockerfile.dockerignore",
        **kw,
    )


def test_same_inputs_reuse_the_image_and_a_changed_input_rebuilds(
    docker_client, test_image, tmp_path, cleanup
):
    ctx = tiny_context(tmp_path)
    events = []
    first = build(spec_for(ctx, test_image), docker_client, on_event=events.append)
    assert first.built and first.tag.startswith(f"{REPOSITORY}:t-") and len(first.tag.rsplit("-", 1)[1]) == 12
    assert [e.text for e in events if e.kind == "step"][:4] == [
        "ARG BASE_IMAGE",
        "FROM ${BASE_IMAGE}",
        "COPY app/ /app/",
        "RUN cat /app/a.txt",
    ]
    assert any(e.kind == "log" and e.text == "one" for e in events)  # the RUN step's own output
    labels = docker_client.api.inspect_image(first.tag)["Config"]["Labels"]
    assert labels[HASH_LABEL] == first.inputs_hash
    assert labels["io.sparkctl.base-id"] == docker_client.api.inspect_image(test_image)["Id"]
    assert docker_client.api.inspect_image(f"{REPOSITORY}:alias")["Id"] == first.image_id

    again = build(spec_for(ctx, test_image), docker_client)
    assert not again.built and again.tag == first.tag and again.image_id == first.image_id

    (ctx / "app" / "ignored.log").write_text("edited, but ignored by the build context\n")
    assert build(spec_for(ctx, test_image), docker_client).tag == first.tag

    (ctx / "app" / "a.txt").write_text("two\n")
    changed = build(spec_for(ctx, test_image), docker_client)
    assert changed.built and changed.tag != first.tag
    assert docker_client.api.inspect_image(f"{REPOSITORY}:alias")["Id"] == changed.image_id

    with_arg = build(spec_for(ctx, test_image, build_args={"PIN": "2"}), docker_client)
    assert with_arg.tag not in (first.tag, changed.tag)
    assert {3, 4} <= set(with_arg.cached_steps)  # COPY and RUN did not change: reused from the cache

    forced = build(spec_for(ctx, test_image, build_args={"PIN": "2"}), docker_client, nocache=True)
    assert forced.built and forced.tag == with_arg.tag and not forced.cached_steps
    assert with_arg.image_id not in {r.id for r in list_images(docker_client)}  # no untagged leftover


def test_a_missing_base_is_one_line(docker_client, tmp_path) -> None:
    ctx = tiny_context(tmp_path)
    with pytest.raises(UserError) as err:
        build(spec_for(ctx, "sparkctl-imagetest/no-such-base:1"), docker_client)
    assert str(err.value) == "base image sparkctl-imagetest/no-such-base:1 is not on this machine"
    assert "--base IMAGE" in (err.value.hint or "")
    proc = sparkctl("build", "--base", "sparkctl-imagetest/no-such-base:1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "error: base image sparkctl-imagetest/no-such-base:1 is not on this machine",
        "hint: pull it (docker pull sparkctl-imagetest/no-such-base:1) or choose another with --base IMAGE "
        "(see docker/README.md)",
    ]


def test_a_failing_step_names_its_line_and_shows_its_output(docker_client, test_image, tmp_path, cleanup):
    ctx = tiny_context(tmp_path, run="echo fetching; echo 'no such wheel' >&2; exit 3")
    with pytest.raises(BuildFailed) as err:
        build(spec_for(ctx, test_image), docker_client)
    # the engine counts the 4 label steps sparkctl adds after the Dockerfile's 4 instructions
    assert str(err.value) == "image build failed at step 4/8 (Dockerfile line 4, RUN): it exited with code 3"
    assert err.value.step is not None and err.value.step.line == 4
    assert "fetching" in err.value.tail and "no such wheel" in err.value.tail
    assert not docker_client.containers.list(all=True, filters={"status": "exited", "ancestor": test_image})


@pytest.fixture
def base_without_python(docker_client, test_image, tmp_path_factory, cleanup) -> str:
    """A base with neither python3 nor apt-get: the real Dockerfile must stop at its first RUN."""
    ctx = tmp_path_factory.mktemp("noapt")
    (ctx / "Dockerfile").write_text(f"FROM {test_image}\nRUN rm -f /usr/bin/apt-get\n")
    tag = f"{REPOSITORY}:no-apt"
    for _ in docker_client.api.build(path=str(ctx), tag=tag, rm=True, forcerm=True, decode=True):
        pass
    return tag


def test_the_real_dockerfile_fails_on_a_base_it_cannot_complete(base_without_python, docker_client) -> None:
    """`sparkctl build` end to end on docker/Dockerfile: one error line naming the step and line, the
    failing instruction and the step's own words above it, exit 1, and no image left tagged."""
    proc = sparkctl("build", "--base", base_without_python)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr.splitlines()
    assert err[-1].startswith("error: image build failed at step ") and err[-1].endswith(
        f"(Dockerfile line {_first_run_line()}, RUN): it exited with code 1"
    ), err[-1]
    assert sum(line.startswith("error:") for line in err) == 1
    assert any(line.startswith(f"  Dockerfile line {_first_run_line()}: RUN set -eux;") for line in err)
    assert any("the base image lacks: python3" in line and "no apt-get" in line for line in err)
    assert "Traceback" not in proc.stderr


def _first_run_line() -> int:
    from sparkctl.image.context import instructions

    text = (REPO / "docker" / "Dockerfile").read_text()
    return next(i.line for i in instructions(text) if i.text.startswith("RUN"))


def test_image_ls_rm_and_save(docker_client, test_image, tmp_path, cleanup) -> None:
    result = build(spec_for(tiny_context(tmp_path), test_image), docker_client)
    rows = {r.id: r for r in list_images(docker_client)}
    assert result.image_id in rows and result.tag in rows[result.image_id].tags
    assert rows[result.image_id].base == test_image

    with pytest.raises(UserError, match="not built by sparkctl build"):
        remove(docker_client, test_image)

    # ssh stand-in that runs the remote command here: the docker save | docker load stream is real
    fake_ssh = tmp_path / "ssh-here"
    fake_ssh.write_text('#!/bin/sh\nshift\nexec "$@"\n')
    fake_ssh.chmod(0o755)
    docker_client.api.remove_image(f"{REPOSITORY}:alias")
    sent = save_to_host(docker_client, result.tag, "spark2", ssh=str(fake_ssh))
    assert sent > 1 << 20
    assert docker_client.api.inspect_image(result.tag)["Id"] == result.image_id

    assert remove(docker_client, result.tag) == [result.tag]
    assert result.image_id not in {r.id for r in list_images(docker_client)}
    proc = sparkctl("image", "rm", result.tag)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: no image {result.tag} on this machine")


def test_up_with_a_missing_image_says_sparkctl_build(test_image) -> None:
    recipe = str(Path(__file__).with_name("tiny-docker.yaml"))
    proc = sparkctl("up", recipe, "--set", "container.image=sparkctl/vllm-exl3:imagetest-absent", timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert "error: Docker image sparkctl/vllm-exl3:imagetest-absent not found locally" in lines
    assert (
        "hint: build it, in a sparkctl checkout: sparkctl build tiny-docker (or sparkctl up tiny-docker --build)"
        in lines
    )


def test_a_failed_push_is_one_line_and_leaves_no_tag(docker_client, test_image, tmp_path, cleanup) -> None:
    result = build(spec_for(tiny_context(tmp_path), test_image), docker_client)
    with pytest.raises(RuntimeFailure) as err:
        push(docker_client, result.tag, "127.0.0.1:9")  # nothing listens on the discard port
    assert str(err.value).startswith("push to 127.0.0.1:9 failed: ") and "\n" not in str(err.value)
    assert docker_client.api.images(name=f"127.0.0.1:9/{REPOSITORY}") == []


def test_up_build_refuses_the_local_test_image(test_image) -> None:
    """`up --build` builds the Spark image a recipe names; the docker e2e recipe runs the image made by
    `make test-image`, which sparkctl build must not overwrite: one line, exit 2, before any container."""
    recipe = str(Path(__file__).with_name("tiny-docker.yaml"))
    proc = sparkctl("up", recipe, "--build", timeout=180)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "error: tiny-docker runs the local test image sparkctl-test:cpu, made by `make test-image`, "
        "not by sparkctl build"
    )
