"""docker/compose.yml is what `sparkctl render glm-5.3-flash --format compose` prints (home directory
written as ${HOME}); this keeps the checked-in file from drifting from the recipe and the renderer."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml
from dockerkit import REPO

COMPOSE = REPO / "docker" / "compose.yml"
RECIPE = "glm-5.3-flash"


RENDER_HOME = "/home/sparkctl-render"  # as scripts/render-compose.sh renders it


def rendered() -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "SPARKCTL_", "XDG_"))}
    env["HOME"] = RENDER_HOME
    proc = subprocess.run(
        [sys.executable, "-m", "sparkctl", "render", RECIPE, "--format", "compose"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    if proc.returncode != 0 and "No such command" in proc.stderr:
        pytest.skip("`sparkctl render` is not in this checkout yet")
    assert proc.returncode == 0, proc.stderr
    home = re.escape(RENDER_HOME)
    return "".join(
        re.sub(r"^(\s*(?:source|target): )" + home + r"(?=/|$)", r"\1${HOME}", line)
        for line in proc.stdout.splitlines(True)
    )


@pytest.mark.slow
def test_compose_file_is_in_sync_with_the_recipe() -> None:
    expected = rendered()
    assert COMPOSE.read_text() == expected, "docker/compose.yml is out of date: run scripts/render-compose.sh"


def test_compose_file_runs_our_image_with_gpus_on_the_host_network() -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    (service,) = doc["services"].values()
    assert service["image"] == "sparkctl/vllm-exl3:0.33.0-sm121"
    assert service["container_name"] == f"sparkctl-{RECIPE}"
    assert service["network_mode"] == "host" and service["ipc"] == "host"
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] for d in devices)
    sources = [v["source"] for v in service["volumes"]]
    assert all(s.startswith("${HOME}/") for s in sources), sources  # no one machine's home baked in
    assert any(v["target"] == "/root/.cache/huggingface" for v in service["volumes"])
