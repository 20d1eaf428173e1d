"""The T1 profile definition, its scaling, the boot variants and the conditions block (no server)."""

from __future__ import annotations

import pytest

from sparkctl.bench import boot, conditions, t1
from sparkctl.bench.client import BenchInputError
from sparkctl.cli import main


def test_t1_is_the_published_grid() -> None:
    p = t1.get_profile("t1")
    assert p is t1.T1 and p.prompts == (128, 4096) and p.outputs == (256, 1024)
    assert p.depths == (0, 32768, 131072) and p.concurrency == (1, 4, 8) and p.runs == 3 and not p.thinking
    tasks = p.tasks()
    assert len(tasks) == 2 * 2 * 3 * 3 and len({t1.task_key(t) for t in tasks}) == 36
    assert tasks[0] == {"depth": 0, "pp": 128, "tg": 256, "concurrency": 1}


def test_a_scaled_profile_says_it_was_modified() -> None:
    p = t1.get_profile("t1", ("depths=0,128", "prompts=64", "runs=1"))
    assert p.name == "t1 (modified)" and p.depths == (0, 128) and p.prompts == (64,) and p.runs == 1
    assert p.outputs == (256, 1024)
    for bad in ("depths", "nope=1", "runs=0", "prompts=a"):
        with pytest.raises(BenchInputError):
            t1.get_profile("t1", (bad,))


def test_boot_variants_follow_what_the_installed_vllm_offers() -> None:
    offered = {"load_formats": ["auto", "fastsafetensors"], "strategies": ["eager"]}
    labels = [v.label for v in boot.variants(offered)]
    assert labels == ["default", "prewarm", "fastsafetensors", "eager"]
    fast = boot.variants(offered, ("fastsafetensors",))[0]
    assert "serve.load_format=fastsafetensors" in fast.sets and "load.prewarm=never" in fast.sets
    with pytest.raises(BenchInputError, match="instanttensor"):
        boot.variants(offered, ("instanttensor",))


def test_request_conditions_state_thinking_and_sampling() -> None:
    c = conditions.request_conditions(
        {"temperature": 0.0, "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}}
    )
    assert c["thinking"] == "off" and c["sampling"] == {"temperature": 0.0, "ignore_eos": True}
    assert conditions.request_conditions({})["thinking"] == "server default"
    with conditions.GpuSampler(interval_s=0.1) as gpu:
        pass
    assert "sampled" in gpu.summary()


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "--url", "http://x", "--resume", "a.json"], "--resume completes a --profile t1 run"),
        (
            ["bench", "--url", "http://127.0.0.1:9", "--profile", "t1", "--profile-set", "x=1"],
            "--profile-set",
        ),
    ],
)
def test_bad_profile_options_are_one_line_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_refused_start_keeps_the_root_cause_not_the_wrapper(tmp_path) -> None:
    log = tmp_path / "tiny.log"
    log.write_text(
        "(APIServer pid=1) WARNING [system_utils.py:255] ... like `OSError: [Errno 24] Too many open files`\n"
        "(Worker pid=2) ERROR [multiproc_executor.py:953] RuntimeError: Invalid device string: 'cuda:cpu'\n"
        "(EngineCore pid=3) ERROR [core.py:1510] Exception: WorkerProc initialization failed due to an "
        "exception in a background process. See stack trace for root cause.\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
    )
    assert boot._refusal(log) == "RuntimeError: Invalid device string: 'cuda:cpu'"


@pytest.mark.slow  # runs a stand-in nvidia-smi script
def test_gpu_sampler_reads_clocks_and_falls_back_on_an_older_driver(tmp_path) -> None:
    """No NVIDIA GPU on the CI box: a script answers as nvidia-smi 535 does (CSV, no units), and
    refuses `clocks_event_reasons` the way drivers before 535 do, so the fallback query is used."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in *clocks_event_reasons*) echo "Field \\"clocks_event_reasons.active\\" is not a valid field"'
        " >&2; exit 2;; esac\n"
        'echo "NVIDIA GB10, 2100, 3003, 2150, 0x0000000000000004, 55.20, 140.00, 61"\n'
    )
    smi.chmod(0o755)
    rows = conditions.query_gpus(str(smi))
    assert rows[0]["name"] == "NVIDIA GB10" and rows[0]["clocks.sm"] == 2100.0
    assert rows[0]["clocks_event_reasons.active"] == "0x0000000000000004"
    gpu = conditions.GpuSampler(interval_s=0.05)
    gpu.exe = str(smi)
    with gpu:
        import time

        time.sleep(0.3)
    g = gpu.summary()["gpus"][0]
    assert g["sm_clock_mhz"]["median"] == 2100.0 and g["sm_clock_max_mhz"] == 3003.0
    assert g["sm_clock_cap_mhz"] == 2150.0 and g["capped"] and g["power_w"]["median"] == 55.2
