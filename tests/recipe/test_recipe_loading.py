"""Recipe loading: located errors (file:line:column), suggestions, extends, --set and the catalog."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from sparkctl.errors import UserError
from sparkctl.recipe import builtin_names, list_recipes, load_recipe, recipe_dirs
from sparkctl.recipe.loader import parse_override

MINIMAL = """\
schema: 1
runtime: native
model:
  generate: tiny-llama
engine:
  device: cpu
serve:
  max_model_len: 512
  kv_cache_memory_bytes: 268435456
"""


def write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(source: str | Path, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(UserError) as info:
        load_recipe(str(source), overrides)
    return str(info.value)


def test_minimal_recipe_loads_and_takes_its_name_from_the_file(tmp_path: Path) -> None:
    recipe = load_recipe(str(write(tmp_path, MINIMAL, "my-model.yaml")))
    assert recipe.name == "my-model"
    assert recipe.serve.max_model_len == 512
    assert recipe.serve.port == 8000  # documented default
    assert recipe.load.prewarm == "auto"


def test_malformed_yaml_reports_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "schema: 1\nmodel:\n  repo: a/b\n   x: 1\n")
    assert error_of(path).startswith(f"{path}:4:5: invalid YAML: mapping values are not allowed")
    path = write(tmp_path, "schema: 1\nserve: {a: 1\nmodel: x\n", "flow.yaml")
    assert error_of(path).startswith(f"{path}:3:6: invalid YAML:")


def test_tab_indentation_is_a_located_yaml_error(tmp_path: Path) -> None:
    path = write(tmp_path, "schema: 1\nserve:\n\tmax_model_len: 5\n")
    assert error_of(path).startswith(f"{path}:3:1: invalid YAML")


def test_unknown_nested_key_points_at_its_line_with_a_suggestion(tmp_path: Path) -> None:
    path = write(
        tmp_path, MINIMAL.replace("  max_model_len: 512\n", "  max_model_len: 512\n  max_num_seq: 4\n")
    )
    msg = error_of(path)
    assert msg.startswith(f"{path}:9:3: unknown key 'max_num_seq' in serve; did you mean 'max_num_seqs'?")


def test_unknown_top_level_key_suggests_the_close_one(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "bech:\n  runs: 1\n")
    assert f"{path}:10:1: unknown key 'bech' in the top level; did you mean 'bench'?" in error_of(path)


def test_unknown_key_without_a_close_match_lists_the_valid_ones(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "load:\n  zzzz: 1\n")
    msg = error_of(path)
    assert f"{path}:11:3: unknown key 'zzzz' in load (valid: prewarm, workers, evict_after_load)" in msg


def test_wrong_type_is_reported_at_the_value_line(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("max_model_len: 512", 'max_model_len: "512"'))
    msg = error_of(path)
    assert msg.startswith(f"{path}:8:3: serve.max_model_len: Input should be a valid integer")
    assert "got str '512'" in msg


def test_bool_for_a_string_and_out_of_range_values(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "load:\n  workers: 0\n")
    assert f"{path}:11:3: load.workers: Input should be greater than 0" in error_of(path)


def test_utilisation_and_kv_bytes_are_mutually_exclusive(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "")
    text = path.read_text().replace(
        "  kv_cache_memory_bytes", "  gpu_memory_utilization: 0.5\n  kv_cache_memory_bytes"
    )
    path.write_text(text)
    msg = error_of(path)
    assert msg.startswith(
        f"{path}:7:1: serve: gpu_memory_utilization and kv_cache_memory_bytes are mutually exclusive"
    )


def test_missing_required_field_points_at_its_parent(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("  max_model_len: 512\n", ""))
    assert f"{path}:7:1: serve.max_model_len: required field is missing" in error_of(path)


def test_model_needs_exactly_one_source(tmp_path: Path) -> None:
    path = write(
        tmp_path, MINIMAL.replace("  generate: tiny-llama\n", "  generate: tiny-llama\n  repo: a/b\n")
    )
    assert "model: set exactly one of repo, path or generate (got repo, generate)" in error_of(path)


def test_unknown_generator_is_refused_at_plan_time(tmp_path: Path) -> None:
    """Generators are the models layer's business: the schema (below the planner) does not know their names,
    the planner refuses an unknown one before anything runs (`validate`, `show`, `up --dry-run`)."""
    from sparkctl.planner import plan

    recipe = load_recipe(str(write(tmp_path, MINIMAL.replace("tiny-llama", "tiny-lama"))))
    with pytest.raises(UserError, match="model.generate: unknown generator 'tiny-lama'") as info:
        plan(recipe)
    assert "tiny-llama" in (info.value.hint or "")


def test_duplicate_keys_are_errors_not_last_one_wins(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "runtime: docker\n")
    assert error_of(path) == f"{path}:10:1: duplicate key 'runtime'"


def test_several_errors_are_all_reported_in_text_order(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("device: cpu", "device: tpu") + "bogus: 1\n")
    lines = error_of(path).splitlines()
    assert lines[0].startswith(f"{path}:6:3: engine.device:")
    assert lines[1].strip().startswith(f"{path}:10:1: unknown key 'bogus'")


def test_schema_version_must_be_1(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("schema: 1", "schema: 2"))
    assert error_of(path).startswith(f"{path}:1:1: schema: Input should be 1")


def test_a_recipe_that_is_not_a_mapping(tmp_path: Path) -> None:
    assert error_of(write(tmp_path, "- a\n- b\n")).endswith("a recipe is a mapping of keys, got list")
    assert "empty recipe" in error_of(write(tmp_path, "", "empty.yaml"))


def test_unknown_builtin_name_suggests_and_lists() -> None:
    msg = error_of("glm-5.3-flsh")
    assert "unknown recipe 'glm-5.3-flsh'; did you mean 'glm-5.3-flash'?" in msg
    assert "tiny" in msg


def test_missing_file_path() -> None:
    assert error_of("/nonexistent/x.yaml") == "recipe file not found: /nonexistent/x.yaml"


# ---- extends


def test_extends_deep_merges_and_does_not_inherit_the_name(tmp_path: Path) -> None:
    write(tmp_path, MINIMAL + "name: base-recipe\nenv:\n  A: 1\n  B: 2\n", "base.yaml")
    child = write(
        tmp_path,
        "schema: 1\nextends: base.yaml\nserve:\n  max_model_len: 256\nenv:\n  B: 3\n",
        "child.yaml",
    )
    recipe = load_recipe(str(child))
    assert recipe.name == "child"
    assert recipe.serve.max_model_len == 256
    assert recipe.serve.kv_cache_memory_bytes == 268435456  # inherited from the base
    assert recipe.env == {"A": 1, "B": 3}


def test_extends_a_builtin_by_name(tmp_path: Path) -> None:
    child = write(tmp_path, "schema: 1\nextends: tiny\nserve:\n  port: 8123\n", "mine.yaml")
    recipe = load_recipe(str(child))
    assert recipe.serve.port == 8123
    assert recipe.model.generate == "tiny-llama"


def test_errors_in_a_variant_point_at_the_file_that_wrote_the_key(tmp_path: Path) -> None:
    write(tmp_path, MINIMAL, "base.yaml")
    child = write(tmp_path, "schema: 1\nextends: base.yaml\nserve:\n  max_model_len: -1\n", "child.yaml")
    assert error_of(child).startswith(f"{child}:4:3: serve.max_model_len: Input should be greater than 0")
    base = write(tmp_path, MINIMAL + "bogus: 1\n", "base2.yaml")
    child2 = write(tmp_path, "schema: 1\nextends: base2.yaml\n", "child2.yaml")
    assert error_of(child2).startswith(f"{base}:10:1: unknown key 'bogus'")


def test_null_in_a_variant_turns_an_inherited_block_off(tmp_path: Path) -> None:
    child = write(tmp_path, "schema: 1\nextends: glm-5.3-flash\nserve:\n  speculative: null\n", "nospec.yaml")
    recipe = load_recipe(str(child))
    assert recipe.serve.speculative is None
    assert recipe.serve.max_model_len == 65536


def test_extends_cycle_is_detected(tmp_path: Path) -> None:
    write(tmp_path, "schema: 1\nextends: b.yaml\n", "a.yaml")
    write(tmp_path, "schema: 1\nextends: a.yaml\n", "b.yaml")
    msg = error_of(tmp_path / "a.yaml")
    assert msg.startswith("extends cycle:")
    assert "a.yaml -> " in msg and msg.endswith("a.yaml")


def test_extends_unknown_target_is_located(tmp_path: Path) -> None:
    child = write(tmp_path, "schema: 1\nextends: tinyy\n", "c.yaml")
    msg = error_of(child)
    assert msg.startswith(f"{child}:2:1: unknown recipe 'tinyy'; did you mean 'tiny'?")


# ---- --set


def test_parse_override_values_are_yaml() -> None:
    assert parse_override("serve.port=8100") == (("serve", "port"), 8100)
    assert parse_override("serve.enforce_eager=true") == (("serve", "enforce_eager"), True)
    assert parse_override("serve.extra_args=[--a, b]") == (("serve", "extra_args"), ["--a", "b"])
    assert parse_override("serve.speculative=null") == (("serve", "speculative"), None)
    assert parse_override("model.revision=abc=def") == (("model", "revision"), "abc=def")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("serve.port", "expected key.path=value"),
        ("=3", "expected key.path=value"),
        ("a..b=1", "empty segment"),
    ],
)
def test_parse_override_rejects_malformed(text: str, fragment: str) -> None:
    with pytest.raises(UserError, match=fragment):
        parse_override(text)


def test_set_overrides_apply_in_order_and_create_blocks() -> None:
    recipe = load_recipe(
        "tiny",
        [
            "serve.port=9001",
            "serve.port=9002",
            "serve.speculative={method: ngram, num_speculative_tokens: 3}",
        ],
    )
    assert recipe.serve.port == 9002
    assert recipe.serve.speculative.method == "ngram"
    assert recipe.serve.speculative.num_speculative_tokens == 3


def test_set_errors_name_the_override() -> None:
    msg = error_of("tiny", ("serve.prot=9000",))
    assert msg.startswith("--set serve.prot=9000: unknown key 'prot' in serve; did you mean 'port'?")
    msg = error_of("tiny", ("serve.port=abc",))
    assert msg.startswith("--set serve.port=abc: serve.port: Input should be a valid integer")


def test_set_through_a_scalar_is_refused() -> None:
    assert "serve.port is not a mapping" in error_of("tiny", ("serve.port.x=1",))


def test_set_can_make_a_recipe_conflict() -> None:
    msg = error_of("tiny", ("serve.gpu_memory_utilization=0.5",))
    assert "mutually exclusive" in msg


def test_a_rule_about_the_whole_recipe_reads_as_one_plain_sentence() -> None:
    msg = error_of("tiny", ("runtime=docker",))
    assert msg.endswith(
        "tiny.yaml:3:1: runtime docker needs container.image (the image to run: --set container.image=IMAGE)"
    ), msg
    assert "(recipe)" not in msg


# ---- catalog


def test_every_builtin_recipe_is_valid() -> None:
    entries = list_recipes()
    names = {e.name for e in entries}
    for required in (
        "tiny",
        "glm-5.3-flash",
        "glm-5.3-flash-k2k3",
        "qwen3.8-flash-next",
        "glm-5.3-flash-4bpw-2x",
        "ornith-1.5-35b-a3b-iq3s",
    ):
        assert required in names
    broken = [(e.name, e.error) for e in entries if e.error]
    assert broken == []


def test_catalog_rows_carry_what_list_shows() -> None:
    by_name = {e.name: e for e in list_recipes()}
    glm = by_name["glm-5.3-flash"]
    assert (glm.model, glm.format, glm.size_bytes, glm.engine, glm.runtime) == (
        "vcruz305/GLM-5.3-Flash-EXL3-K2@main",
        "exl3",
        97728721536,
        "vllm 0.33.0",
        "docker",
    )
    assert by_name["tiny"].model == "generated: tiny-llama"
    assert by_name["glm-5.3-flash-4bpw-2x"].nodes == 2


def test_broken_recipe_is_listed_with_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, MINIMAL + "bogus: 1\n", "broken.yaml")
    monkeypatch.setenv("SPARKCTL_RECIPES_DIR", str(tmp_path))
    entries = {e.name: e for e in list_recipes()}
    assert "unknown key 'bogus'" in entries["broken"].error
    assert entries["tiny"].error is None  # the checkout's recipes are still found after the override


def test_recipes_are_found_under_an_installed_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    share = tmp_path / "share" / "sparkctl" / "recipes"
    share.mkdir(parents=True)
    (share / "only-in-wheel.yaml").write_text(MINIMAL)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert share in recipe_dirs()
    assert "only-in-wheel" in builtin_names()
    assert load_recipe("only-in-wheel").name == "only-in-wheel"


def test_builtin_recipe_values_match_the_notes() -> None:
    glm = load_recipe("glm-5.3-flash")
    assert glm.model.expected_shards == 120
    assert glm.model.expected_bytes == 97_728_721_536
    assert glm.serve.speculative.method == "mtp" and glm.serve.speculative.num_speculative_tokens == 2
    assert glm.serve.long_prefill_token_threshold == 1024
    assert glm.serve.enable_prefix_caching is True
    assert glm.serve.kv_cache_dtype == "fp8"
    qfn = load_recipe("qwen3.8-flash-next")
    assert qfn.model.revision == "3.05bpw_h5_ng5"
    assert qfn.serve.speculative.acceptance_cliff_tokens == 163_840
    assert qfn.memory.max_utilization == 0.85
    mix = load_recipe("glm-5.3-flash-k2k3")
    assert mix.model.repo == "vcruz305/GLM-5.3-Flash-EXL3-K2K3-mix"
    assert mix.model.expected_shards is None  # not inherited: the mix's own counts are unpublished
    tiny = load_recipe("tiny")
    assert (tiny.runtime, tiny.model.generate, tiny.engine.device, tiny.serve.enforce_eager) == (
        "native",
        "tiny-llama",
        "cpu",
        True,
    )


def test_pyproject_ships_the_recipes_where_the_loader_looks() -> None:
    """A wheel installs recipes/*.yaml as data files under <prefix>/share/sparkctl/recipes."""
    import tomllib

    repo = Path(__file__).resolve().parents[2]
    config = tomllib.loads((repo / "pyproject.toml").read_text())
    data_files = config["tool"]["setuptools"]["data-files"]
    assert data_files["share/sparkctl/recipes"] == ["recipes/*.yaml"]
    assert sorted(p.stem for p in (repo / "recipes").glob("*.yaml")) == builtin_names()


def test_a_failed_union_is_one_error_not_one_per_branch(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "env:\n  A: [1]\n")
    assert error_of(path) == f"{path}:11:3: env.A: expected str or int or float or bool, got list [1]"


def test_missing_key_inside_a_list_item_points_at_the_item(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "container:\n  mounts:\n    - {source: /a}\n")
    assert error_of(path) == f"{path}:12:7: container.mounts.0.target: required field is missing"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: &x [*x]\n", "r.yaml:1:4: recursive YAML alias"),
        ("? [a]\n: 1\n", "r.yaml:1:3: keys must be strings, got a sequence"),
        ("1: x\n", "r.yaml:1:1: keys must be strings, got 1"),
        (
            "base: &b {x: 1}\nother:\n  <<: *b\n",
            "r.yaml:3:3: YAML merge keys (<<) are not supported; use extends:",
        ),
        ("a: !!python/object:os.system x\n", "r.yaml:1:4: could not determine a constructor"),
    ],
)
def test_yaml_features_a_recipe_must_not_use(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    assert error_of(path).startswith(f"{tmp_path}/{message}")


def test_alias_bombs_are_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for i in range(1, 6):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    path = write(tmp_path, "\n".join(lines) + "\n")
    assert error_of(path) == f"{path}: YAML aliases expand to more than 100,000 values"


def test_a_file_name_that_is_not_a_valid_recipe_name(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL, "My Model.yaml")
    assert "name: recipe name 'My Model' must be lowercase letters" in error_of(path)
    assert load_recipe(str(path), ["name=my-model"]).name == "my-model"


@pytest.mark.parametrize("value", ["16g", "512m", "112GB", "1.5g", "64k"])
def test_docker_sizes_accepted(value: str) -> None:
    assert load_recipe("glm-5.3-flash", [f"container.shm_size={value}"]).container.shm_size == value


def test_docker_size_typo_is_refused() -> None:
    msg = error_of("glm-5.3-flash", ("container.memory_limit=112 gigs",))
    assert "container.memory_limit: '112 gigs' is not a Docker size" in msg
