#!/usr/bin/env bash
# Download, into <repo root>/.whl/, the wheels the lent H200 needs to import exllamav3 1.6.5 (the side-by-side peer
# of kernels/bench/peer_exllamav3.py). Run HERE (the device has no network), from the repo root; then name `.whl` in
# the device call's `carry` and install there with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site
#
# Why these: exllamav3's Requires-Dist are torch, tokenizers, numpy, rich, typing_extensions, safetensors, ninja,
# pillow, pyyaml, marisa_trie, pydantic, llguidance. The device image (/work/.library/device/KINDS.md) has all of
# them but pydantic, marisa_trie and llguidance. Importing exllamav3 needs pydantic at module level
# (exllamav3/util/memory.py); marisa_trie is imported by its safetensors loader (list_tensors), which its converter
# and Model.load go through (tests/fixtures/exl3_real/make_fixtures.py; binary: cp312 manylinux_2_28, no runtime
# deps); llguidance (grammar filter, import guarded) is never imported, so it is left out. pydantic 2.x needs
# pydantic-core (binary: cp312 manylinux), annotated-types and typing-inspection; typing_extensions is carried at pydantic-core's floor so the device's own
# copy, whatever its version, cannot be too old. One version of each (two stop pip's install). `.whl/` is in
# .gitignore, so the wheels travel only when carried.
set -euo pipefail
dest=${1:-.whl}
mkdir -p "$dest"
py=${PYTHON:-python3}
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for req in exllamav3==1.6.5 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
           typing-inspection==0.4.5 typing-extensions==4.16.0 marisa-trie==1.4.1; do
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${plat[@]}" -d "$dest" "$req"
done
ls -la "$dest"
