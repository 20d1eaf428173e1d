"""Parallel page-cache warm-up, eviction and residency for model shards (`python -m prewarm`).

The public API, used by `sparkctl up` and `sparkctl prewarm`:

- `model_files(path)` -> shard paths in loader order
- `warm(files, workers=8, ...)` -> WarmReport; `measure_disk(files)` -> WarmReport (O_DIRECT)
- `evict(files)` -> EvictReport; `residency(files)` -> fraction cached
- `fit_check(need_bytes)` -> FitResult; `memory_status()`
- `EvictionSteward(files)` keeps evicting while a server loads; `is_unified_memory()`
- `decide(policy, fit=..., unified=...)` -> what `up` should do before and during the load
"""

from prewarm.errors import BadInput, DoesNotFit, Interrupted, PrewarmError
from prewarm.files import FileInfo, inspect_files, model_files
from prewarm.fit import FitResult, MemoryStatus, fit_check, memory_status
from prewarm.policy import LoadDecision, decide
from prewarm.report import WarmReport
from prewarm.residency import EvictReport, evict, residency, resident_bytes
from prewarm.steward import EvictionSteward
from prewarm.unified import detect_unified_memory, is_unified_memory
from prewarm.warm import Progress, measure_disk, warm

__all__ = [
    "BadInput",
    "DoesNotFit",
    "EvictReport",
    "EvictionSteward",
    "FileInfo",
    "FitResult",
    "Interrupted",
    "LoadDecision",
    "MemoryStatus",
    "PrewarmError",
    "Progress",
    "WarmReport",
    "decide",
    "detect_unified_memory",
    "evict",
    "fit_check",
    "inspect_files",
    "is_unified_memory",
    "measure_disk",
    "memory_status",
    "model_files",
    "residency",
    "resident_bytes",
    "warm",
]
