"""Container HEALTHCHECK for the sparkctl serving image: healthy once vLLM's /health answers 200.

The port is per recipe, so the runtime passes it in SPARKCTL_PORT (sparkctl.runtimes.docker sets it on
every container; compose files rendered by sparkctl carry it too). Standard library only: it runs in
the image's Python with nothing else assumed.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    port = os.environ.get("SPARKCTL_PORT", "8000")
    url = f"http://127.0.0.1:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=4) as resp:
            ok = resp.status == 200
    except (urllib.error.URLError, OSError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    print(f"{'healthy' if ok else 'unhealthy'}: {url}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
