"""Pins in one place: recipes may not contradict them, plans carry them, doctor compares image labels."""

from __future__ import annotations

import pytest

from sparkctl.doctor import ImageFacts, check_image
from sparkctl.errors import UserError
from sparkctl.image.context import instructions
from sparkctl.image.spark import sm, spark_spec
from sparkctl.pins import DEFAULT, PIN_LABEL_PREFIX, conflicts, pins_for
from sparkctl.planner import plan
from sparkctl.recipe import load_recipe


def test_vllm_0_33_pins_are_what_its_wheel_requires() -> None:
    p = pins_for("vllm", "0.33.0")
    assert p is DEFAULT
    assert (p.torch, p.flashinfer, p.cuda) == ("2.14.0", "0.7.2.post1", "13.0")
    assert pins_for("vllm", "0.32.0") is None and pins_for("llama.cpp", "b11434") is None


def test_a_recipe_pin_that_contradicts_the_release_is_refused() -> None:
    assert conflicts(DEFAULT, {"torch": "2.14.0+cu130", "exllamav3": "1.6.5"}) == []
    assert conflicts(DEFAULT, {"torch": "2.13.0+cu130"}) == [
        "torch 2.13.0+cu130 (vllm 0.33.0 needs torch==2.14.0)"
    ]
    with pytest.raises(UserError, match=r"engine: pins contradict .*torch 2.13.0\+cu130"):
        load_recipe("glm-5.3-flash", ["engine.pins.torch=2.13.0+cu130"])


def test_plans_carry_the_effective_pins_and_the_spark_build_passes_them() -> None:
    recipe = load_recipe("glm-5.3-flash", ["engine.pins.exllamav3=1.6.5"])
    p = plan(recipe, model_path=None, check_memory=False)
    assert p.image_pins["torch"] == "2.14.0" and p.image_pins["exllamav3"] == "1.6.5"
    spec, pins = spark_spec(recipe, root=None)
    assert spec.alias == recipe.container.image == "sparkctl/vllm-exl3:0.33.0-sm121"
    assert spec.prefix == "0.33.0-sm121" and spec.build_args["KERNEL_ARCHS"] == "sm_121"
    assert spec.build_args["TORCH_VERSION"] == "2.14.0"
    assert spec.labels[PIN_LABEL_PREFIX + "exllamav3"] == "1.6.5"
    other, _ = spark_spec(recipe, arch="12.0")
    assert other.alias == "sparkctl/vllm-exl3:0.33.0-sm120"  # never the recipe's sm121 name
    assert sm("12.1a") == "sm_121a"
    with pytest.raises(UserError, match="not a CUDA compute capability"):
        sm("sm121")


def test_the_local_test_image_is_not_built_by_sparkctl_build() -> None:
    with pytest.raises(UserError, match="make test-image"):
        spark_spec(load_recipe("tiny", ["runtime=docker", "container.image=sparkctl-test:cpu"]))


def test_doctor_compares_the_image_labels_with_the_pins() -> None:
    p = plan(load_recipe("glm-5.3-flash"), model_path=None, check_memory=False)
    image = p.container.image
    labels = {PIN_LABEL_PREFIX + k: v for k, v in p.image_pins.items()}
    assert check_image(ImageFacts(image), p).status == "fail"
    assert "sparkctl build glm-5.3-flash" in (check_image(ImageFacts(image), p).hint or "")
    ok = check_image(ImageFacts(image, present=True, labels=labels), p)
    assert ok.status == "pass" and "torch 2.14.0" in ok.detail
    stale = check_image(
        ImageFacts(image, present=True, labels={**labels, PIN_LABEL_PREFIX + "torch": "2.13.0"}), p
    )
    assert stale.status == "fail" and "torch 2.13.0 (pinned 2.14.0)" in stale.detail
    assert check_image(ImageFacts(image, present=True, labels={}), p).status == "warn"
    assert check_image(None, None).status == "pass"


def test_failed_steps_map_to_dockerfile_lines() -> None:
    text = "# c\nARG A=1\n\nFROM x\nRUN a \\\n  # inner comment\n    && b\nCOPY . /\n"
    got = [(i.line, i.text) for i in instructions(text)]
    assert got == [(2, "ARG A=1"), (4, "FROM x"), (5, "RUN a && b"), (8, "COPY . /")]
