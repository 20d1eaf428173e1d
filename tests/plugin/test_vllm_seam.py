"""The vLLM interface the plugin relies on, checked on every release it runs on (issue 34).

``sparkctl_exl3.vllm_plugin.compat`` names that interface (``RELIES_ON``) and the one place the releases differ
for EXL3 (``EXPERT_3D_READ_AS_FUSED``). The installed vLLM (0.32 CPU) is checked by import; 0.26 (the lent GPU's),
0.33 (the Spark's) and 0.34 by reading their wheels' sources from PyPI (tests/plugin/vllm_wheels.py), so a release
that renames a parameter or changes the experts heuristic fails here, not on a Spark.
"""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest
import vllm_wheels
from packaging.version import Version

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

OTHER_RELEASES = ("0.26.0", "0.33.0", "0.34.0")


def _compat():
    from sparkctl_exl3.vllm_plugin import compat

    return compat


def _params(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            found = [m for m in node.body if isinstance(m, ast.FunctionDef) and m.name == name]
            if found:
                return found[-1]  # the implementation after any @overload stubs
            raise AssertionError(f"{cls} has no method {name}")
    raise AssertionError(f"no class {cls}")


def test_installed_vllm_has_what_the_plugin_relies_on() -> None:
    for module, cls, name, expected in _compat().RELIES_ON:
        fn = getattr(getattr(importlib.import_module(module), cls), name)
        got = list(inspect.signature(fn).parameters)
        assert got[: len(expected)] == list(expected), f"{module}.{cls}.{name}{tuple(got)}"


@pytest.mark.parametrize("version", OTHER_RELEASES)
def test_other_releases_have_what_the_plugin_relies_on(version: str) -> None:
    for module, cls, name, expected in _compat().RELIES_ON:
        tree = ast.parse(vllm_wheels.source(version, vllm_wheels.module_path(module)))
        got = _params(_method(tree, cls, name))
        assert got[: len(expected)] == list(expected), f"vllm {version}: {cls}.{name}{tuple(got)}"


def _reads_3d_as_fused(version: str) -> bool:
    """Whether ``RoutedExperts.load_weights`` of ``version`` decides "fused" from the tensor's rank alone."""
    tree = ast.parse(vllm_wheels.source(version, "vllm/model_executor/layers/fused_moe/routed_experts.py"))
    for node in ast.walk(_method(tree, "RoutedExperts", "load_weights")):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "is_fused" for t in node.targets):
            return ast.unparse(node.value) == "loaded_weight.dim() == 3"
    raise AssertionError(f"vllm {version}: RoutedExperts.load_weights has no is_fused")


@pytest.mark.parametrize("version", ("0.26.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"))
def test_the_experts_rank_heuristic_is_where_compat_says(version: str) -> None:
    """0.26 loaded no EXL3 MoE pack on the H100 (a 3-D per-expert trellis unbound as if it held all experts);
    compat switches on the plugin's own per-expert loader exactly for the releases whose source reads rank alone."""
    assert _reads_3d_as_fused(version) == _compat().expert_3d_read_as_fused(Version(version).release)


def test_compat_rule_for_the_installed_release() -> None:
    import vllm

    compat = _compat()
    assert compat.expert_3d_read_as_fused(Version(vllm.__version__).release) == compat.EXPERT_3D_READ_AS_FUSED
