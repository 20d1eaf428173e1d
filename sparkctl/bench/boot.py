"""`sparkctl bench boot RECIPE`: a cold start measured in stages, per load path.

Boot time is part of the experience (the seed's 91 GiB pack took about 12 minutes), and peers now
load with fastsafetensors or InstantTensor and report docker-start -> port -> health -> first token.
So each variant starts the recipe through `up` from a cold page cache and stamps, from the moment
`up` is called:

  launched (the process or container is running) -> port open (something accepts on the port) ->
  weights loaded (the engine's own "Loading weights took" line in the log, with its own seconds) ->
  healthy (/health and /v1/models answer) -> first token (one streamed chat request)

Variants: the recipe's default loader, the same with pre-warm, and each alternative load path the
installed vLLM offers (--load-format fastsafetensors / instanttensor, --safetensors-load-strategy
eager / prefetch). A path that refuses to start is recorded with the engine's reason, not hidden.
The page cache is dropped through /proc/sys/vm/drop_caches where the host allows it (root, a
writable /proc/sys), else each weight file is evicted with posix_fadvise(DONTNEED) and the record
says which (and how much stayed resident).
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkctl.errors import SparkctlError
from sparkctl.up import Reporter

STAGES = ("launched", "weights_loaded", "port_open", "healthy", "first_token")  # vLLM binds after loading
_WEIGHTS = re.compile(
    r"Loading weights took ([0-9.]+) seconds|Model loading took [0-9.]+ GiB memory and ([0-9.]+) seconds"
)


@dataclass(frozen=True)
class Variant:
    label: str
    sets: tuple[str, ...]  # --set overrides for `up`
    description: str


def offered_load_paths() -> dict[str, list[str]]:
    """Load formats and safetensors strategies the vLLM in this Python knows (read from its source, no import)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return {"load_formats": [], "strategies": []}
    root = Path(next(iter(spec.submodule_search_locations)))
    formats: list[str] = []
    with contextlib.suppress(OSError):
        text = (root / "model_executor" / "model_loader" / "__init__.py").read_text()
        block = text.split("_LOAD_FORMAT_TO_MODEL_LOADER", 1)[1].split("}", 1)[0]
        formats = re.findall(r'"([a-z_]+)":', block)
    strategies: list[str] = []
    with contextlib.suppress(OSError):
        load_py = (root / "config" / "load.py").read_text()
        if "safetensors_load_strategy" in load_py:
            strategies = [s for s in ("eager", "prefetch") if f'"{s}"' in load_py]
    return {"load_formats": formats, "strategies": strategies}


ALTERNATIVE_FORMATS = ("fastsafetensors", "instanttensor")


def variants(offered: dict[str, list[str]], only: tuple[str, ...] = ()) -> list[Variant]:
    out = [
        Variant("default", ("load.prewarm=never",), "the engine's default loader (mmap), cold cache"),
        Variant("prewarm", ("load.prewarm=always",), "sparkctl's 8-worker pre-warm, then the default loader"),
    ]
    for fmt in ALTERNATIVE_FORMATS:
        if fmt in offered.get("load_formats", []):
            out.append(
                Variant(fmt, ("load.prewarm=never", f"serve.load_format={fmt}"), f"--load-format {fmt}")
            )
    for strat in offered.get("strategies", []):
        out.append(
            Variant(
                strat,
                ("load.prewarm=never", f"serve.extra_args=[--safetensors-load-strategy, {strat}]"),
                f"--safetensors-load-strategy {strat}",
            )
        )
    if only:
        unknown = [o for o in only if o not in {v.label for v in out}]
        if unknown:
            from sparkctl.bench.client import BenchInputError

            raise BenchInputError(
                f"unknown boot variant(s): {', '.join(unknown)}",
                hint=f"offered here: {', '.join(v.label for v in out)}",
            )
        out = [v for v in out if v.label in only]
    return out


def drop_page_cache(files: list[Path]) -> dict[str, Any]:
    """Make the weights cold: drop_caches where allowed, else evict each file; report what stayed."""
    import os

    import prewarm

    method = None
    with contextlib.suppress(OSError):
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        method = "drop_caches (whole page cache)"
    if method is None:
        prewarm.evict(files, verify=False)
        method = "posix_fadvise(DONTNEED) on each weight file (drop_caches not allowed here)"
    total = sum(f.stat().st_size for f in files)
    resident = sum(prewarm.resident_bytes(f) for f in files)
    return {"method": method, "weights_bytes": total, "resident_bytes_after": resident}


class _Watch:
    """Stamps the port opening and the weights-loaded log line while `up` waits for health."""

    def __init__(self, port: int, log_path: Path, t0: float) -> None:
        self.port, self.log_path, self.t0 = port, log_path, t0
        self.stamps: dict[str, float] = {}
        self.engine_load_s: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="boot-watch", daemon=True)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _inode(self) -> int | None:
        try:
            return self.log_path.stat().st_ino
        except OSError:
            return None

    def _loop(self) -> None:
        stale = self._inode()  # the previous launch's log until `up` rotates it: never read
        pos, ino = 0, None
        while not self._stop.is_set():
            now = time.monotonic() - self.t0
            if "port_open" not in self.stamps:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.05),
                ):
                    self.stamps["port_open"] = now
            cur = self._inode()
            if cur != ino:  # a new log file: read it from its start
                pos, ino = 0, cur
            if "weights_loaded" not in self.stamps and cur is not None and cur != stale:
                with contextlib.suppress(OSError), self.log_path.open("rb") as f:
                    f.seek(pos)
                    chunk = f.read().decode("utf-8", "replace")
                    cut = chunk.rfind("\n") + 1
                    pos += len(chunk[:cut].encode())
                    m = _WEIGHTS.search(chunk[:cut])
                    if m:
                        self.stamps["weights_loaded"] = now
                        self.engine_load_s = float(m.group(1) or m.group(2))
            if len(self.stamps) == 2:
                return
            self._stop.wait(0.02)


class _Stamp(Reporter):
    """An `up` Reporter that stamps when the launch step finished (the rest of the hooks: Reporter's,
    which do nothing)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.launched: float | None = None
        self.prewarm_s: float | None = None

    def step(self, name: str, detail: str, seconds: float | None = None) -> None:
        if name == "launch":
            self.launched = time.monotonic() - self.t0
        if name == "prewarm" and seconds is not None:
            self.prewarm_s = seconds


def _first_token(base_url: str, model: str, t0: float) -> tuple[float | None, str | None]:
    from sparkctl.bench.client import Target, request_body, timed_request

    target = Target(base_url=base_url, model=model, timeout_s=300)
    http = target.new_http()
    try:
        t_send = time.monotonic() - t0
        s = timed_request(http, target, request_body(target, "Say hello.", 4, ignore_eos=True))
    finally:
        http.close()
    if not s.ok or s.ttft_s is None:
        return None, s.error
    return t_send + s.ttft_s, None


def boot_one(recipe: str, variant: Variant, *, port: int, base_sets: tuple[str, ...] = ()) -> dict[str, Any]:
    """One cold start of `recipe` with the variant's settings; the server is stopped afterwards."""
    from sparkctl import servers
    from sparkctl.recipe.overrides import Overrides
    from sparkctl.runtimes import state as state_files
    from sparkctl.up import UpOptions, run_up

    sets = (*base_sets, *variant.sets)
    opts = UpOptions(recipe=recipe, overrides=Overrides(sets=sets, port=port), smoke=False, restart=True)
    from sparkctl.recipe.overrides import load as load_recipe

    name = load_recipe(recipe, Overrides(sets=sets)).name
    st = servers.find_state(name)
    if st is not None:
        servers.stop(st)
    cache = drop_page_cache(_weight_files(recipe, sets))
    out: dict[str, Any] = {"label": variant.label, "description": variant.description, "sets": list(sets),
                           "cache": cache, "ok": False}  # fmt: skip
    t0 = time.monotonic()
    rep = _Stamp(t0)
    watch = _Watch(port, state_files.log_path(name), t0)
    res = None
    try:
        with watch:
            res = run_up(opts, rep)  # type: ignore[arg-type]
            healthy = time.monotonic() - t0
        first, err = _first_token(res.state.base_url, res.plan.served_model_name, t0)
        stamps = {"launched": rep.launched, **watch.stamps, "healthy": healthy, "first_token": first}
        out.update(ok=first is not None, stages_s=stamps, engine_load_s=watch.engine_load_s,
                   prewarm_s=rep.prewarm_s, error=err)  # fmt: skip
    except SparkctlError as exc:
        out["error"] = str(exc).splitlines()[0][:400]
        out["reason"] = _refusal(state_files.log_path(name))
        out["stages_s"] = {"launched": rep.launched, **watch.stamps}
    finally:
        st = servers.find_state(name)
        if st is not None:
            servers.stop(st)
    return out


_EXC = re.compile(r"(?:^|\] )([A-Z][A-Za-z.]*(?:Error|Exception)): (.+)$")


def _refusal(log: Path) -> str | None:
    """The engine's own words for a refused start: the root-cause exception line of its log.

    vLLM prints the worker's real error first and then wrappers ("Engine core initialization
    failed. See root cause above"); the first exception line that is not such a wrapper is the cause.
    """
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        m = _EXC.search(line)
        if m:
            found.append(f"{m.group(1)}: {m.group(2).strip()}"[:400])
    causes = [f for f in found if not re.search(r"initialization failed|See (root cause|stack trace)", f)]
    if causes or found:
        return (causes or found)[0]
    return lines[-1].strip()[-400:] if lines else None


def _weight_files(recipe: str, sets: tuple[str, ...]) -> list[Path]:
    """The recipe's local weight files (for the cache drop); the model must be on disk already."""
    from sparkctl.bench.client import BenchInputError
    from sparkctl.up import locate_model

    try:
        d, _ = locate_model(recipe, tuple(sets))
    except SparkctlError as exc:
        raise BenchInputError(
            f"bench boot measures a start from local weights: {exc}",
            hint=f"fetch or make them once with `sparkctl up {recipe}` (then `sparkctl down`)",
        ) from exc
    files = sorted(
        p for p in Path(d).rglob("*") if p.suffix in (".safetensors", ".gguf", ".bin") and p.is_file()
    )
    return files or sorted(p for p in Path(d).rglob("*") if p.is_file())


def _median_run(label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A variant's runs folded into one: medians of each stage over the runs that started."""
    import statistics

    ok = [r for r in runs if r["ok"]]
    first = runs[0]
    out = {k: first[k] for k in ("label", "description", "sets", "cache")} | {"runs": runs, "ok": bool(ok)}
    if not ok:
        out.update(error=first.get("error"), reason=first.get("reason"), stages_s=first.get("stages_s"))
        return out
    stages = {}
    for k in STAGES:
        vals = [r["stages_s"].get(k) for r in ok if r["stages_s"].get(k) is not None]
        stages[k] = statistics.median(vals) if vals else None
    loads = [r["engine_load_s"] for r in ok if r.get("engine_load_s") is not None]
    pre = [r["prewarm_s"] for r in ok if r.get("prewarm_s") is not None]
    out.update(
        stages_s=stages,
        engine_load_s=statistics.median(loads) if loads else None,
        prewarm_s=statistics.median(pre) if pre else None,
        spread_first_token_s=[
            min(r["stages_s"]["first_token"] for r in ok),
            max(r["stages_s"]["first_token"] for r in ok),
        ],
    )
    return out


def run(
    recipe: str,
    *,
    only: tuple[str, ...] = (),
    base_sets: tuple[str, ...] = (),
    port: int | None = None,
    repeat: int = 1,
    progress: Any = None,
) -> dict[str, Any]:
    """Every variant `repeat` times, interleaved (round after round, so drift on a shared host hits
    all alike); medians per stage, ratios against the default loader's."""
    from sparkctl.bench import record as records
    from sparkctl.server.ports import free_port

    offered = offered_load_paths()
    vs = variants(offered, only)
    runs: dict[str, list[dict[str, Any]]] = {v.label: [] for v in vs}
    for i in range(repeat):
        for v in vs:
            if i and runs[v.label] and not any(r["ok"] for r in runs[v.label]):
                continue  # a path that refused once refuses again
            if progress is not None:
                progress.note(f"boot {recipe}: {v.label} ({v.description}), round {i + 1}/{repeat}")
            runs[v.label].append(boot_one(recipe, v, port=port or free_port(), base_sets=base_sets))
    results = [_median_run(v.label, runs[v.label]) for v in vs]
    base = next((r for r in results if r["label"] == "default" and r["ok"]), None)
    for r in results:
        for key in ("first_token", "healthy"):
            mine = (r.get("stages_s") or {}).get(key)
            ref = (base or {}).get("stages_s", {}).get(key)
            r[f"{key}_ratio"] = mine / ref if r["ok"] and mine and ref else None
        r["engine_load_ratio"] = (
            r["engine_load_s"] / base["engine_load_s"]
            if r["ok"] and base and base.get("engine_load_s") and r.get("engine_load_s")
            else None
        )
    ok = [r for r in results if r["ok"]]
    fastest = min(ok, key=lambda r: r["stages_s"]["first_token"]) if ok else None
    decided = fastest
    if (
        fastest is not None
        and base is not None
        and fastest is not base
        and not _clearly_faster(fastest, base)
    ):
        decided = base  # inside the default's own run-to-run range: no reason to leave the default
    return {
        "schema": "sparkctl-boot/1",
        "recipe": recipe,
        "created_at": records.now_iso(),
        "host": records.host_info(),
        "repeat": repeat,
        "offered": offered,
        "stages": list(STAGES),
        "variants": results,
        "fastest": fastest["label"] if fastest else None,
        "recommendation": decided
        and {
            "label": decided["label"],
            "sets": decided["sets"],
            "why": "fastest to first token, outside the default's run-to-run range"
            if decided is not base
            else (
                "the default loader: no other path beat its run-to-run range"
                if fastest is not base
                else "the default loader was fastest"
            ),
        },
    }


def _clearly_faster(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Is a's slowest start faster than b's fastest (no overlap of their first-token ranges)?"""
    ra, rb = a.get("spread_first_token_s"), b.get("spread_first_token_s")
    return bool(ra and rb and ra[1] < rb[0])


def write(rec: dict[str, Any], out_dir: Path) -> list[Path]:
    """boot.json and boot.html into out_dir (each written temp-then-rename)."""
    from sparkctl.bench import record as records
    from sparkctl.bench.report import render_boot_html

    return [
        records.save(rec, out_dir / "boot.json"),
        records.write_text(render_boot_html(rec), out_dir / "boot.html"),
    ]
