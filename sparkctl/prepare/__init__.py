"""The prepare stage: what a published pack needs before vLLM can load it, without editing the download.

A pack as published can be unloadable as-is: an index that omits tensor files, a config.json that
does not declare what the tensors are, no chat template for the mode the recipe serves. The stage
builds an overlay directory of symlinks into the download plus the few rewritten files, and `up`
serves the overlay. The Hugging Face cache stays exactly as downloaded, so other tools sharing it
see the published pack, and deleting the overlay undoes everything.

- ``layout``: where an overlay lives (from the recipe alone; `show` and `--dry-run` name it).
- ``plan``: what the overlay must hold for a given download (reads headers and configs only).
- ``apply``: make or reuse the overlay, atomically; ``remove`` it.
- ``headers``, ``index``, ``pack_config``: the safetensors-header facts and the two rewrites.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkctl.models.source import ModelSource
    from sparkctl.prepare.apply import PrepareResult
    from sparkctl.prepare.plan import PreparePlan


def prepare_model(
    source: ModelSource, model_dir: Path, *, dry_run: bool = False
) -> tuple[PreparePlan, PrepareResult | None]:
    """Plan and (unless `dry_run`) apply the recipe's prepare steps for the downloaded `model_dir`.

    Returns (PreparePlan, PrepareResult or None). Raises UserError when the recipe has no steps.
    """
    from sparkctl.errors import UserError
    from sparkctl.prepare.apply import apply
    from sparkctl.prepare.plan import plan_prepare

    if source.prepare is None:
        raise UserError("this recipe has no model.prepare steps: its pack is served as downloaded")
    p = plan_prepare(source.prepare, model_dir)
    return p, (None if dry_run else apply(p))
