"""Pack a slimmed vLLM for the lent GPU machine, so the engine check (``engine_check.py``) runs vLLM's CUDA build there.

The device has Python 3.12 and torch 2.11 (cu130) but no vLLM and no network, and one call carries at most 64 MiB
(work tree included). vLLM 0.26.0 is the last release built against torch 2.11, so that is the vLLM we carry. Its
wheel is 304 MB; what the engine check runs needs much less of it:

* the two op libraries (``_C_stable_libtorch``, ``_moe_C_stable_libtorch``, 126 MB) hold machine code for eight GPU
  architectures. Only sm_90 cubins and PTX up to compute_90 can ever be chosen on an H100/H200, so the payloads of
  every other fatbin entry are zeroed in place (section sizes and offsets unchanged, so the ELF stays valid, and
  xz squeezes the zeros away);
* flash-attention (460 MB), FlashMLA, qutlass, deep_gemm, the Rust router binary and the vendored C++ headers are
  left out: the check selects vLLM's Triton attention backend. ``vllm_flash_attn/__init__.py`` raises ImportError
  when its libraries are absent and ``models/llama.py`` imports it (through ``mm_encoder_attention``) even with
  Triton attention selected, so that one raise is turned off in the copy (the import then succeeds with
  ``FA2_AVAILABLE = FA3_AVAILABLE = False``; calling flash-attention would still fail loudly);
* xgrammar and llguidance (structured output) are left out: two dataclasses name their types in annotations that
  Python evaluates at import, so those two modules get ``from __future__ import annotations`` in the copy;
* the Python packages vLLM imports that the device image lacks (found by importing every module of the engine
  path on a local torch 2.11 with the device's package set; :data:`DEPS`), as wheels for cp312 manylinux x86-64.

The plugin's entry point (``vllm.general_plugins: exl3``) is written as a small dist-info into the same tree, so vLLM
finds the plugin exactly as it does in the image. Output: ``<out>/site.tar.xz`` (unpack with ``engine_unpack.sh``)
and ``<out>/MANIFEST.json`` (what is inside, with sizes). Downloads are cached under ``--cache``
(default ``~/.cache/sparkctl/device-engine``) and reused when present.

    python3 kernels/bench/engine_pack.py [--out .device/engine] [--cache DIR] [--budget-mib 36]

Exit 1 (one line) when a download fails, the flash-attention line to patch is not where it was, or the archive is
over the budget.
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import os
import struct
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

VLLM = "vllm==0.26.0"

#: What vLLM 0.26.0's engine path (``vllm.LLM``, ``vllm serve``, the V1 engine core and GPU worker, torch.compile,
#: the Llama / Qwen3-MoE / GLM-4-MoE (+MTP) model files, ``get_quantization_config``, which imports every method's
#: module: compressed-tensors and loguru) imports that the device image does not have. Versions: the
#: newest that vLLM 0.26.0's requirements admit. xgrammar (126 MB) and llguidance are not carried: vLLM loads them
#: lazily, except for two dataclass annotations that :data:`FUTURE_ANNOTATIONS` defers.
DEPS = (
    "annotated-types==0.8.0",
    "blake3==1.0.11",
    "cachetools==8.0.2",
    "cbor2==6.3.0",
    "compressed-tensors==0.17.0",
    "fastapi==0.136.3",
    "httpx2==2.17.0",
    "jmespath==1.1.0",
    "loguru==0.7.3",
    "model-hosting-container-standards==0.1.16",
    "msgspec==0.23.0",
    "openai-harmony==0.0.8",
    "openai==3.63.0",
    "partial-json-parser==0.2.1.1.post7",
    "prometheus-fastapi-instrumentator==8.1.0",
    "pybase64==1.5.1",
    "pydantic-core==2.50.5",
    "pydantic==2.14.4",
    "pyzmq==27.3.0",
    "setproctitle==1.3.8",
    "sniffio==1.3.1",
    "starlette==1.10.0",
    "typing-inspection==0.4.5",
    "uvicorn==0.55.0",
    "watchfiles==1.3.0",
)

PLATFORMS = (
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)

#: Files of the vLLM wheel the check never loads.
SKIP_PREFIXES = (
    "vllm/vllm_flash_attn/_vllm_fa",  # the flash-attention libraries (Triton attention is used)
    "vllm/vllm-rs",
    "vllm/_flashmla_C",
    "vllm/_qutlass_C",
    "vllm/_rust_tool_parser",
)
SKIP_SUFFIXES = (".hpp", ".h", ".cuh", ".cu", ".cpp", ".inl")
FATBIN_LIBS = ("vllm/_C_stable_libtorch.abi3.so", "vllm/_moe_C_stable_libtorch.abi3.so")
KEEP_ARCH = 90

FA_INIT = "vllm/vllm_flash_attn/__init__.py"
FA_RAISE = "if not (FA2_AVAILABLE or FA3_AVAILABLE):\n    raise ImportError("
FA_PATCHED = (
    "if False:  # sparkctl engine check: libraries left out, Triton attention selected (engine_pack.py)\n"
    "    raise ImportError("
)

#: Structured-output backends whose dataclass annotations name xgrammar / llguidance types, evaluated at import time;
#: with postponed evaluation (PEP 563) they stay strings, and the engine imports without those packages. A request
#: that asks for structured output would still fail loudly when the backend loads them.
FUTURE_ANNOTATIONS = (
    "vllm/v1/structured_output/backend_xgrammar.py",
    "vllm/v1/structured_output/backend_guidance.py",
)

PLUGIN_DIST = "sparkctl_exl3_plugin-0.0.0.dist-info"


class PackError(RuntimeError):
    pass


def download(cache: Path) -> tuple[Path, list[Path]]:
    """The vLLM wheel and the dependency wheels, downloaded once into ``cache/dl``."""
    dl = cache / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    want = [VLLM, *DEPS]
    missing = [r for r in want if not _find_wheel(dl, r)]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        cmd += ["--python-version", "3.12", "--implementation", "cp", *plat, "-d", str(dl), *missing]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            lines = [ln for ln in r.stderr.splitlines() if "ERROR" in ln] or r.stderr.splitlines()[-1:]
            raise PackError(f"pip download failed: {lines[0] if lines else r.returncode}")
    wheels = []
    for req in want:
        w = _find_wheel(dl, req)
        if w is None:
            raise PackError(f"no wheel for {req} in {dl} after downloading")
        wheels.append(w)
    return wheels[0], wheels[1:]


def _find_wheel(dl: Path, req: str) -> Path | None:
    name, _, version = req.partition("==")
    stem = name.replace("-", "_").lower()
    for w in dl.glob("*.whl"):
        parts = w.name.split("-")
        if parts[0].lower() == stem and parts[1] == version:
            return w
    return None


def prune_fatbins(data: bytearray, keep_arch: int = KEEP_ARCH) -> dict[str, int]:
    """Zero, in place, the payload of every fatbin entry a ``keep_arch`` GPU can never load.

    Kept: cubins for exactly ``keep_arch`` (sm_90 and sm_90a). A cubin of another architecture cannot run on sm_90
    (cubins run only on their own major version, at or above their minor) and the driver prefers a matching cubin to
    PTX. In vLLM 0.26.0 the translation units with PTX but no sm_90 cubin are Marlin (GPTQ/AWQ, and its MoE) and
    cutlass' sm75-89 FP8 GEMMs (their PTX is zstd-compressed; read with ``zstandard``, entry names listed), which an
    EXL3 model never calls; their PTX is dropped too (15 MB), and a call into them would fail loudly ("no kernel
    image is available").
    The fatbin layout (public CUDA headers, ``fatbinary_section.h`` and cuobjdump's view of it): a 16-byte header
    (magic 0xBA55ED50, version, header size, size of the entries) followed by entries, each a header (kind 1 = PTX,
    2 = ELF; header size at +4; payload size at +8; SM architecture at +28) and its payload.
    """
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = heads[shstrndx][4]
    sec = None
    for h in heads:
        name = bytes(data[strtab + h[0] : data.index(b"\0", strtab + h[0])]).decode()
        if name == ".nv_fatbin":
            sec = (h[4], h[5])
    if sec is None:
        raise PackError("no .nv_fatbin section")
    stats = {"kept": 0, "zeroed": 0, "fatbins": 0}
    p, end = sec[0], sec[0] + sec[1]
    while p + 16 <= end:
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", data, p)
        if magic != 0xBA55ED50:
            p += 8  # fatbins are 8-byte aligned; padding between them
            continue
        stats["fatbins"] += 1
        entries = []  # (kind, arch, payload start, payload size)
        q, qend = p + hsize, p + hsize + fsize
        while q < qend:
            kind, _u, ehsize, psize = struct.unpack_from("<HHIQ", data, q)
            arch = struct.unpack_from("<I", data, q + 28)[0]
            entries.append((kind, arch, q + ehsize, psize))
            q += ehsize + psize
        for kind, arch, start, psize in entries:
            keep = kind == 2 and arch == keep_arch
            if keep:
                stats["kept"] += psize
            else:
                data[start : start + psize] = bytes(psize)
                stats["zeroed"] += psize
        p = qend
    if not stats["kept"]:
        raise PackError(f"no sm_{keep_arch} code found in the fatbins")
    return stats


def build_tree(vllm_wheel: Path, deps: list[Path]) -> tuple[dict[str, bytes], dict]:
    """{path in site-packages: bytes} for vLLM (slimmed) and the dependencies, and a manifest."""
    files: dict[str, bytes] = {}
    manifest: dict = {
        "vllm": vllm_wheel.name,
        "deps": [d.name for d in deps],
        "fatbins": {},
        "skipped_bytes": 0,
    }
    with zipfile.ZipFile(vllm_wheel) as z:
        for info in z.infolist():
            n = info.filename
            if info.is_dir():
                continue
            third_party_binary = n.startswith("vllm/third_party/") and not n.endswith(".py")
            if n.startswith(SKIP_PREFIXES) or n.endswith(SKIP_SUFFIXES) or third_party_binary:
                manifest["skipped_bytes"] += info.file_size
                continue
            data = z.read(n)
            if n in FATBIN_LIBS:
                buf = bytearray(data)
                manifest["fatbins"][n] = prune_fatbins(buf)
                data = bytes(buf)
            elif n == FA_INIT:
                text = data.decode()
                if FA_RAISE not in text:
                    raise PackError(
                        f"{FA_INIT}: the ImportError to disable is not where it was; re-read the file"
                    )
                data = text.replace(FA_RAISE, FA_PATCHED).encode()
            elif n in FUTURE_ANNOTATIONS:
                text = data.decode()
                if "from __future__ import annotations" not in text:
                    text = (
                        "from __future__ import annotations  # engine_pack.py: xgrammar/llguidance not carried\n"
                        + text
                    )
                data = text.encode()
            files[n] = data
    for wheel in deps:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                if not info.is_dir() and ".data/scripts/" not in info.filename:
                    files[info.filename] = z.read(info.filename)
    files[f"{PLUGIN_DIST}/METADATA"] = b"Metadata-Version: 2.1\nName: sparkctl-exl3-plugin\nVersion: 0.0.0\n"
    files[f"{PLUGIN_DIST}/entry_points.txt"] = (
        b"[vllm.general_plugins]\nexl3 = sparkctl_exl3.vllm_plugin:register\n"
    )
    return files, manifest


def write_archive(files: dict[str, bytes], out: Path) -> int:
    """site.tar.xz, written to a temp name and renamed (an interrupted pack leaves no half archive)."""
    tmp = out.with_suffix(".tmp")
    with (
        lzma.open(
            tmp, "wb", preset=9 | lzma.PRESET_EXTREME if os.environ.get("ENGINE_PACK_EXTREME") else 9
        ) as xz,
        tarfile.open(fileobj=xz, mode="w") as tar,
    ):
        for name in sorted(files):
            data = files[name]
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if name.endswith(".so") or ".so." in name else 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    return out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(".device/engine"))
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "sparkctl" / "device-engine")
    ap.add_argument("--budget-mib", type=float, default=36.0, help="fail when site.tar.xz is larger")
    a = ap.parse_args(argv)
    t0 = time.time()
    try:
        vllm_wheel, deps = download(a.cache)
        files, manifest = build_tree(vllm_wheel, deps)
        a.out.mkdir(parents=True, exist_ok=True)
        size = write_archive(files, a.out / "site.tar.xz")
    except PackError as exc:
        print(f"engine pack: FAILED: {exc}")
        return 1
    manifest["raw_bytes"] = sum(len(v) for v in files.values())
    manifest["archive_bytes"] = size
    (a.out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    mib = size / 2**20
    print(
        f"engine pack: {a.out / 'site.tar.xz'} {mib:.1f} MiB ({manifest['raw_bytes'] / 1e6:.0f} MB unpacked, "
        f"{len(deps)} dependency wheels) in {time.time() - t0:.0f} s"
    )
    if mib > a.budget_mib:
        print(f"engine pack: FAILED: {mib:.1f} MiB is over the budget of {a.budget_mib} MiB")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
