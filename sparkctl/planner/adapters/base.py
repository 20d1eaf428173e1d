"""The engine adapter contract: what each engine contributes to a plan, a container and a check-up."""

from __future__ import annotations

import shlex
from typing import Any

from sparkctl.recipe.schema import Recipe


class EngineAdapter:
    """Defaults are vLLM-like where an engine has nothing of its own to say; each adapter overrides."""

    name: str = ""
    # the variable the engine reads its API key from (the key's 0600 env file sets it)
    api_key_env: str = "VLLM_API_KEY"
    # how to get the engine's executable when a native plan's argv[0] is missing
    install_hint: str = "install the engine"
    # the doctor check that probes the binary/venv sparkctl installs for a native plan (None: none)
    doctor_check: str | None = None
    # flags upstream removed -> why (refused in serve.extra_args before a pull and a load)
    removed_flags: dict[str, str] = {}
    # the KV cache is allocated up front for the whole context (not profiled from a utilisation budget)
    kv_up_front: bool = False
    kv_owner: str = ""  # who allocates it, for the memory plan's note
    # sparkctl builds the Spark image for this engine (`sparkctl build`, pins.py)
    builds_image: bool = False

    def entrypoint(self, recipe: Recipe, *, docker: bool) -> list[str]:
        """The command prefix before the engine's flags (recipe.engine.entrypoint wins; see build)."""
        raise NotImplementedError

    def hub_model(self, recipe: Recipe, notes: list[str]) -> dict[str, str]:
        """What the engine loads when the model is not on this machine (a GGUF pick); {} for a repo name."""
        return {}

    def argv(
        self,
        recipe: Recipe,
        entrypoint: list[str],
        model_arg: str,
        revision: str | None,
        gguf: dict[str, str],
    ) -> list[str]:
        """The full engine command line."""
        raise NotImplementedError

    def check_kv_dtype(self, recipe: Recipe) -> list[str]:
        """Warnings for the recipe's KV dtype; a UserError for one the engine refuses."""
        return []

    def key_gate_args(self) -> tuple[str, ...]:
        """Flags that make the engine refuse every route without the API key, where its own check does not
        cover every route (planner.keyed); () when the engine's key already locks everything."""
        return ()

    def check_model(self, recipe: Recipe, config: dict[str, Any] | None) -> None:
        """A UserError for a model and setting this engine is known to compute wrongly (``config``: the
        model's config.json, None when it is not on this machine yet)."""

    def kv_dtype(self, recipe: Recipe, dtype: str) -> str:
        """The KV dtype the engine actually caches in, for `dtype` resolved from 'auto'."""
        return dtype

    def fit_hint(self, recipe: Recipe) -> str:
        """What to change when the memory plan does not fit."""
        s = recipe.serve
        return f"lower serve.max_model_len (now {s.max_model_len}) or use a smaller quant"

    def health_command(self, url: str) -> str:
        """The container healthcheck (docker's CMD-SHELL) that GETs `url` from inside the image."""
        return f"curl -fsS {shlex.quote(url)}"
