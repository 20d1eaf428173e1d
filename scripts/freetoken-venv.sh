#!/usr/bin/env bash
# Install FreeToken (PyPI `freetoken`) into its own virtualenv, once per version (`make freetoken`).
#
#   scripts/freetoken-venv.sh          prints the venv's `ft` path (installs it first when missing)
#
# FreeToken pins torch 2.14 and transformers 5.18, which the vLLM venv (torch 2.13) cannot share, so it
# gets a venv of its own under ${XDG_CACHE_HOME:-~/.cache}/sparkctl/freetoken/<version>/, reused while
# its `ft` runs. The wheel is CUDA-only at run time (its kernels need an NVIDIA GPU); on a machine
# without one the venv still gives sparkctl FreeToken's real argument parser to check commands against.
set -euo pipefail

VERSION="${FREETOKEN_VERSION:-0.2.1}"
PYTHON="${PYTHON:-python3}"
ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/sparkctl/freetoken"
DEST="$ROOT/$VERSION"
FT="$DEST/bin/ft"

if [[ -x "$FT" && -f "$DEST/.installed" ]]; then
    echo "$FT"
    exit 0
fi
mkdir -p "$ROOT"
# A venv's scripts name its absolute path, so it is built in place; `.installed` is written last, so
# an interrupted install is never taken for a finished one (it is removed and redone).
rm -rf "$DEST"
"$PYTHON" -m venv "$DEST"
"$DEST/bin/pip" install --disable-pip-version-check -q "freetoken==$VERSION" >&2
"$DEST/bin/python" -c "import freetoken.server.args" >&2
"$DEST/bin/python" -c "import freetoken, sys; sys.stdout.write(freetoken.__version__ if hasattr(freetoken, '__version__') else '')" >"$DEST/.installed"
echo "$FT"
