"""`list`, `show`, `render`, `validate`, `schema` through click's CliRunner, and as real processes for the
exit-code contract (bad input: exit 2, one `error:` line, never a traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from sparkctl.cli import cli
from sparkctl.errors import UserError
from sparkctl.recipe import builtin_names

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> object:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=True)
    return result


def ok(*args: str) -> object:
    result = run(*args)
    assert result.exit_code == 0, (result.output, result.exception)
    return result


# ---- list


def test_list_table_shows_every_recipe_with_its_columns() -> None:
    out = ok("list").stdout
    header = out.splitlines()[0].split()
    assert header == ["NAME", "MODEL", "FORMAT", "SIZE", "ENGINE", "RUNTIME", "DESCRIPTION"]
    for name in builtin_names():
        assert name in out
    glm_line = next(line for line in out.splitlines() if line.startswith("glm-5.3-flash "))
    for cell in ("vcruz305/GLM-5.3-Flash-EXL3-K2@main", "exl3 K2", "91.0 GiB", "vllm 0.33.0", "docker"):
        assert cell in glm_line


def test_list_json_is_machine_readable() -> None:
    rows = json.loads(ok("list", "--json").stdout)
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == set(builtin_names())
    assert by_name["tiny"]["runtime"] == "native"
    assert by_name["tiny"]["device"] == "cpu"
    assert by_name["glm-5.3-flash"]["size_bytes"] == 97728721536
    assert all(r["error"] is None for r in rows)


# ---- show


def test_show_prints_recipe_command_and_memory_plan() -> None:
    out = ok("show", "glm-5.3-flash").stdout
    assert "recipe glm-5.3-flash" in out
    assert "repo: vcruz305/GLM-5.3-Flash-EXL3-K2" in out
    assert "--long-prefill-token-threshold 1024" in out
    assert "docker run --rm" in out
    assert "memory plan" in out
    assert "121.69 GiB" in out  # the pool
    assert "582,126" in out  # kv capacity in tokens


def test_show_json_has_recipe_and_plan() -> None:
    data = json.loads(ok("show", "tiny", "--json", "--set", "serve.port=8123").stdout)
    assert data["recipe"]["serve"]["port"] == 8123
    assert data["plan"]["port"] == 8123
    assert data["plan"]["base_url"] == "http://127.0.0.1:8123"
    assert data["plan"]["memory"]["fits"] is True
    assert "--enforce-eager" in data["plan"]["argv"]


def test_show_refuses_an_unfit_plan_unless_told_not_to_check() -> None:
    result = run("show", "glm-5.3-flash", "--set", "serve.max_model_len=2000000")
    assert isinstance(result.exception, UserError)
    assert "does not fit in memory" in str(result.exception)
    data = json.loads(
        ok("show", "glm-5.3-flash", "--set", "serve.max_model_len=2000000", "--no-check", "--json").stdout
    )
    assert data["plan"]["memory"]["fits"] is False


def test_show_accepts_a_recipe_file(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text("schema: 1\nextends: tiny\nserve: {port: 8200}\n")
    data = json.loads(ok("show", str(f), "--json").stdout)
    assert data["recipe"]["name"] == "mine"
    assert data["plan"]["port"] == 8200


# ---- render


def test_render_shell_is_a_docker_run_for_docker_recipes() -> None:
    out = ok("render", "glm-5.3-flash").stdout
    lines = out.splitlines()
    assert lines[1] == "docker run --rm \\"
    assert "  --entrypoint vllm \\" in lines
    assert "  sparkctl/vllm-exl3:0.33.0-sm121 \\" in lines
    assert "  serve /models/glm-5.3-flash \\" in lines  # the prepare overlay (its chat template)


@pytest.mark.slow
def test_render_shell_runs_in_a_real_shell() -> None:
    """The rendered native command is valid shell: run it with the engine swapped for a script that
    prints one of the recipe's env vars and the arguments it received."""
    entry = 'engine.entrypoint=[/bin/sh, -c, \'echo "$DO_NOT_TRACK" "$@"\', sh]'
    out = ok("render", "tiny", "--set", entry).stdout
    proc = subprocess.run(["sh", "-c", out], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    model_dir = str(Path(os.environ["SPARKCTL_CACHE_DIR"]) / "models" / "tiny-llama")
    assert words[:3] == ["1", "--model", model_dir]
    assert words[-1] == "--enforce-eager"


def test_render_json_is_the_plan() -> None:
    data = json.loads(ok("render", "qwen3.8-flash-next", "--format", "json").stdout)
    assert data["recipe_name"] == "qwen3.8-flash-next"
    assert data["argv"][:3] == ["vllm", "serve", "/models/qwen3.8-flash-next"]  # the prepare overlay
    assert data["container"]["image"] == "sparkctl/vllm-exl3:0.33.0-sm121"
    assert data["model"]["revision"] == "3.05bpw_h5_ng5"


def test_render_compose_is_a_runnable_compose_file() -> None:
    text = ok("render", "glm-5.3-flash", "--format", "compose").stdout
    doc = yaml.safe_load(text)
    svc = doc["services"]["glm-5-3-flash"]
    assert svc["image"] == "sparkctl/vllm-exl3:0.33.0-sm121"
    assert svc["entrypoint"][:3] == ["vllm", "serve", "/models/glm-5.3-flash"]
    assert svc["network_mode"] == "host" and svc["ipc"] == "host" and "shm_size" not in svc  # host /dev/shm
    assert svc["init"] is True and svc["environment"]["SPARKCTL_PORT"] == "8000"
    assert svc["ulimits"]["memlock"] == {"soft": -1, "hard": -1}
    gpu = svc["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu == {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    assert svc["environment"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert svc["healthcheck"]["test"][0] == "CMD-SHELL"
    assert svc["healthcheck"]["start_period"] == "1800s"
    assert "http://127.0.0.1:8000/health" in svc["healthcheck"]["test"][-1]
    targets = {v["target"] for v in svc["volumes"]}
    assert "/root/.cache/huggingface" in targets


def test_render_compose_with_a_model_path_mounts_it(tmp_path: Path) -> None:
    doc = yaml.safe_load(
        ok("render", "glm-5.3-flash", "--format", "compose", "--model-path", str(tmp_path)).stdout
    )
    svc = doc["services"]["glm-5-3-flash"]
    vol = next(v for v in svc["volumes"] if v["target"] == "/models/glm-5.3-flash")
    assert vol["source"] == str(tmp_path) and vol["read_only"] is True
    assert svc["entrypoint"][2] == "/models/glm-5.3-flash"


def test_render_compose_refuses_native_recipes() -> None:
    result = run("render", "tiny", "--format", "compose")
    assert isinstance(result.exception, UserError)
    assert "runs natively" in str(result.exception)


def test_render_to_a_file_is_atomic_and_complete(tmp_path: Path) -> None:
    target = tmp_path / "compose.yaml"
    target.write_text("old")
    result = ok("render", "glm-5.3-flash", "--format", "compose", "-o", str(target))
    assert f"wrote {target}" in result.stderr
    assert yaml.safe_load(target.read_text())["services"]
    assert [p.name for p in tmp_path.iterdir()] == ["compose.yaml"]  # no temp file left behind


# ---- validate


def test_validate_accepts_builtins_and_files() -> None:
    out = ok("validate", "tiny", str(REPO / "recipes" / "glm-5.3-flash.yaml")).stdout
    assert "ok: tiny (tiny)" in out
    assert "(glm-5.3-flash)" in out


def test_validate_reports_each_bad_file_and_fails(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: 1\nserve: {max_model_len: 1}\nmodle: {}\n")
    result = run("validate", "tiny", str(bad), "--json")
    assert isinstance(result.exception, UserError)
    assert str(result.exception) == "1 of 2 recipe(s) invalid"
    rows = json.loads(result.stdout)
    assert rows[0]["ok"] is True
    assert rows[0]["memory"]["fits"] is True and rows[0]["memory"]["kv_bytes_per_token"] == 2048
    assert rows[1]["ok"] is False and rows[1]["memory"] is None
    assert f"{bad}:3:1: unknown key 'modle' in the top level; did you mean 'model'?" in rows[1]["error"]


def test_validate_checks_the_memory_plan() -> None:
    result = run("validate", "glm-5.3-flash", "--set", "serve.gpu_memory_utilization=0.6")
    assert isinstance(result.exception, UserError)
    assert "does not fit in memory" in result.stderr


# ---- schema


def test_schema_is_json_schema_with_descriptions_everywhere() -> None:
    schema = json.loads(ok("schema").stdout)
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["additionalProperties"] is False
    assert {"schema", "model", "serve", "extends"} <= set(schema["properties"])
    missing = []

    def walk(node: dict, where: str) -> None:
        for key, prop in node.get("properties", {}).items():
            if "description" not in prop:
                missing.append(f"{where}.{key}")
        for name, sub in node.get("$defs", {}).items():
            assert sub.get("additionalProperties") is False, name
            walk(sub, name)

    walk(schema, "Recipe")
    assert missing == []


def test_schema_to_file(tmp_path: Path) -> None:
    target = tmp_path / "recipe.schema.json"
    ok("schema", "-o", str(target))
    assert json.loads(target.read_text())["title"] == "Recipe"


# ---- real processes: exit codes and no tracebacks


def sparkctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkctl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("list", "extra-argument"), "Got unexpected extra argument"),
        (("show", "no-such-recipe"), "error: unknown recipe 'no-such-recipe'"),
        (("show", "tiny", "--set", "serve.port=abc"), "error: --set serve.port=abc: serve.port:"),
        (("render", "tiny", "--format", "compose"), "error: recipe tiny runs natively"),
        (("render", "tiny", "--format", "yaml"), "Invalid value for '--format'"),
        (("validate", "/nonexistent.yaml"), "error: 1 of 1 recipe(s) invalid"),
        (("schema", "-o", "/nonexistent-dir/x.json"), "error: cannot write /nonexistent-dir/x.json"),
        (("schema", "-o", str(REPO)), "is a directory"),
        (("show",), "Missing argument 'RECIPE'"),
        (("show", "tiny", "--model-path", "/nonexistent-dir"), "'/nonexistent-dir' does not exist"),
        (("up", "tiny", "--port", "70000"), "70000 is not in the range"),
        (("no-such-command",), "No such command 'no-such-command'"),
        (("down", "tiny", "--timeout", "-5"), "-5.0 is not in the range x>=0"),
    ],
)
def test_bad_input_exits_2_without_a_traceback(args: tuple[str, ...], message: str) -> None:
    proc = sparkctl(*args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    # Usage errors too: one `error:` line (and a `hint:`), not click's usage block.
    lines = proc.stderr.splitlines()
    assert [line for line in lines if line.startswith("error: ")], proc.stderr
    assert "Usage:" not in proc.stderr and len(lines) <= 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.slow
def test_list_piped_is_one_line_per_recipe() -> None:
    """`sparkctl list | grep docker` must see whole records: no description folded onto a second line."""
    proc = sparkctl("list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["NAME", *builtin_names()]
    assert all(line == line.rstrip() for line in lines)
    (glm,) = [line for line in lines if line.startswith("glm-5.3-flash ")]
    assert glm.endswith("64k context on one Spark")


@pytest.mark.slow
def test_malformed_recipe_file_in_a_process(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: 1\nmodel:\n  repo: a/b\n   x: 1\n")
    proc = sparkctl("show", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {bad}:4:5: invalid YAML")
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_list_in_a_process_with_a_broken_recipe_still_lists(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("schema: 1\nbogus: 1\n")
    proc = sparkctl("list", env={"SPARKCTL_RECIPES_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "broken" in proc.stdout and "invalid:" in proc.stdout
    assert "tiny" in proc.stdout


def test_validate_a_directory_checks_every_recipe_in_it() -> None:
    out = ok("validate", str(REPO / "recipes")).stdout
    for name in builtin_names():
        assert f"({name})" in out


@pytest.mark.parametrize("name", [n for n in builtin_names() if not n.startswith("tiny")])
def test_compose_names_follow_the_compose_spec(name: str) -> None:
    """Project names: [a-z0-9][a-z0-9_-]*; service names: [a-zA-Z0-9._-]+ (compose-spec)."""
    import re

    result = run(
        "render", name, "--format", "compose", "--set", "runtime=docker", "--set", "container.image=x"
    )
    if isinstance(result.exception, UserError):
        pytest.skip(str(result.exception))
    doc = yaml.safe_load(result.stdout)
    assert re.fullmatch(r"[a-z0-9][a-z0-9_-]*", doc["name"]), doc["name"]
    for service in doc["services"]:
        assert re.fullmatch(r"[a-zA-Z0-9._-]+", service)


def test_show_leaves_out_blocks_that_do_not_apply() -> None:
    out = ok("show", "tiny").stdout
    assert "llama_cpp:" not in out and "container:" not in out and "cluster:" not in out
    two = ok("show", "glm-5.3-flash-4bpw-2x", "--set", "cluster.head_address=10.0.0.1").stdout
    assert "cluster:" in two and "container:" in two
    gguf = ok("show", "qwen3.8-27b-gguf").stdout
    assert "n_gpu_layers: 99" in gguf  # llama-server's own section, as engine.serve
    # an engine's own section exists only on a recipe of that engine (the schema's engine union)
    tiny = json.loads(ok("show", "tiny", "--json").stdout)["recipe"]
    assert "serve" not in tiny["engine"] and "llama_cpp" not in tiny["serve"]
    qwen = json.loads(ok("show", "qwen3.8-27b-gguf", "--json").stdout)["recipe"]
    assert qwen["engine"]["serve"]["n_gpu_layers"] == 99


def test_show_prints_the_command_exactly_as_render_does() -> None:
    """At 80 columns rich would fold long lines; the command in `show` must stay copy-pasteable."""
    shown = ok("show", "glm-5.3-flash").stdout
    rendered = ok("render", "glm-5.3-flash").stdout
    assert rendered in shown
    assert any(len(line) > 80 for line in rendered.splitlines())  # the case that used to fold


# ---- help


def test_every_command_has_an_untruncated_summary_and_every_option_a_help_text() -> None:
    import click

    top = ok("--help").stdout
    listing = top.split("Commands:")[1]
    assert "..." not in listing, (
        listing
    )  # click cuts a long first sentence; each command needs its short help
    ctx = click.Context(cli)
    names = cli.list_commands(ctx)
    assert "chat" in names and "doctor" in names
    for name in names:
        cmd = cli.get_command(ctx, name)
        assert cmd is not None
        undocumented = [
            p.opts for p in cmd.params if isinstance(p, click.Option) and not p.hidden and not p.help
        ]
        assert undocumented == [], (name, undocumented)
        sets = [p for p in cmd.params if "--set" in getattr(p, "opts", ())]
        assert all(p.metavar == "KEY.PATH=VALUE" for p in sets), name  # one spelling across commands
