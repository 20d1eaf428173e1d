"""doctor's llama.cpp and freetoken checks: the binary, its build, CUDA where the recipe needs it, and
where FreeToken cannot run at all. Facts are built by hand for the cases this host cannot show (a CUDA
build, a GPU); the probes run for real against whatever `make` installed here."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl import doctor
from sparkctl.doctor import FreeTokenFacts, Gpu, Needs, NvidiaFacts, check_freetoken, check_llamacpp
from sparkctl.planner import engine_bins
from sparkctl.planner.engine_bins import LLAMA_CPP_BUILD, LlamaServerInfo

CPU_BUILD = LlamaServerInfo("/x/llama-server", LLAMA_CPP_BUILD, "515e855", "GNU 12.2.0", cuda=False)
CUDA_BUILD = LlamaServerInfo("/x/llama-server", LLAMA_CPP_BUILD, "515e855", "GNU 12.2.0", cuda=True)
GB10 = NvidiaFacts((Gpu("NVIDIA GB10", "12.1"),), "580.95", "13.0", "nvidia-smi")


def needs(engine: str | None, gpu: bool, recipe: str | None = "r") -> Needs:
    return Needs(gpu=gpu, recipe=recipe, engine=engine)


def test_llamacpp_reports_binary_build_and_backend() -> None:
    c = check_llamacpp(CPU_BUILD, needs("llama.cpp", gpu=False))
    assert c.status == "pass" and f"build {LLAMA_CPP_BUILD} (515e855), CPU only" in c.detail
    assert "CUDA" in check_llamacpp(CUDA_BUILD, needs("llama.cpp", gpu=True)).detail


def test_llamacpp_cuda_recipe_on_a_cpu_build_fails() -> None:
    c = check_llamacpp(CPU_BUILD, needs("llama.cpp", gpu=True))
    assert c.status == "fail" and "runs on cuda" in c.detail and "LLAMA_BACKEND=cuda" in c.hint


def test_llamacpp_missing_or_other_build() -> None:
    missing = LlamaServerInfo(None, error="'llama-server' not found")
    assert check_llamacpp(missing, needs("llama.cpp", gpu=False)).status == "fail"
    general = check_llamacpp(missing, needs(None, gpu=False, recipe=None))
    assert general.status == "warn" and "make llama-server" in general.hint
    old = LlamaServerInfo("/x", 9000, "abc", None, cuda=False)
    c = check_llamacpp(old, needs("llama.cpp", gpu=False))
    assert c.status == "warn" and f"checked against build {LLAMA_CPP_BUILD}" in c.detail


def test_freetoken_says_where_it_cannot_run() -> None:
    ft = FreeTokenFacts("/v/bin/ft", "0.2.1")
    no_gpu = NvidiaFacts(error="no nvidia-smi on PATH")
    c = check_freetoken(ft, no_gpu, needs("freetoken", gpu=True))
    assert c.status == "fail" and "needs an NVIDIA GPU (CUDA) and this host has none" in c.detail
    assert check_freetoken(ft, no_gpu, needs(None, gpu=False, recipe=None)).status == "warn"
    ok = check_freetoken(ft, GB10, needs("freetoken", gpu=True))
    assert ok.status == "pass" and "NVIDIA GB10" in ok.detail
    assert (
        check_freetoken(FreeTokenFacts(None, error="'ft' not found"), GB10, needs("freetoken", True)).status
        == "fail"
    )


@pytest.mark.slow
def test_engine_checks_only_for_their_recipes() -> None:
    from sparkctl.planner import plan
    from sparkctl.recipe import load_recipe

    names = [c.name for c in doctor.run_checks(plan(load_recipe("tiny-gguf"), check_memory=False))]
    assert "llama.cpp" in names and "freetoken" not in names
    names = [c.name for c in doctor.run_checks(plan(load_recipe("tiny"), check_memory=False))]
    assert "llama.cpp" not in names and "freetoken" not in names
    # in a container the image's llama-server runs, not the one built here
    docker = load_recipe("tiny-gguf", ("runtime=docker", "container.image=local/llama:cpu"))
    names = [c.name for c in doctor.run_checks(plan(docker, check_memory=False), only=None)]
    assert "llama.cpp" not in names


@pytest.mark.slow
def test_probe_the_installed_llama_server(llama_server: Path) -> None:
    info = engine_bins.probe_llama_server(str(llama_server))
    assert info.error is None and info.build == LLAMA_CPP_BUILD and info.cuda is False  # the CPU build
    (c,) = doctor.run_checks(only=["llama.cpp"])
    assert c.status == "pass" and str(llama_server) in c.detail and "CPU only" in c.detail


@pytest.mark.slow
def test_probe_the_installed_freetoken(freetoken_python: Path) -> None:
    facts = doctor.probe_freetoken(needs(None, gpu=False, recipe=None))
    assert facts.error is None and facts.version == engine_bins.FREETOKEN_VERSION


def test_a_cuda_backend_is_found_in_the_binary(tmp_path: Path) -> None:
    fake = tmp_path / "llama-server"
    fake.write_bytes(b"\0" * (1 << 20) + b"ggml_cuda_init: found %d CUDA devices" + b"\0" * 10)
    assert engine_bins._has_cuda_backend(fake)
    fake.write_bytes(b"\0" * 100)
    assert not engine_bins._has_cuda_backend(fake)
    (tmp_path / "libggml-cuda.so").write_bytes(b"\0")
    assert engine_bins._has_cuda_backend(fake)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_plans_name_sparkctls_build_when_it_exists(tmp_path: Path, monkeypatch, device: str) -> None:
    monkeypatch.setenv("SPARKCTL_ENGINES_DIR", str(tmp_path))
    monkeypatch.delenv("SPARKCTL_LLAMA_SERVER", raising=False)
    assert engine_bins.llama_server_command(device) == "llama-server"
    binary = engine_bins.cached_llama_server(device)
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    key = "b11434-cpu" if device == "cpu" else "b11434-cuda-sm121"
    assert engine_bins.llama_server_command(device) == str(
        tmp_path / "llama.cpp" / key / "bin" / "llama-server"
    )
    monkeypatch.setenv("SPARKCTL_LLAMA_SERVER", "/opt/mine/llama-server")
    assert engine_bins.llama_server_command(device) == "/opt/mine/llama-server"
