"""The HTML report is one self-contained file: inlined data that cannot end its <script>, no URLs."""

from __future__ import annotations

import json
import re

from sparkctl.bench.record import DEFINITIONS, SCHEMA_ID
from sparkctl.bench.report import render_html


def test_inlined_record_survives_script_breaking_text() -> None:
    rec = {"schema": SCHEMA_ID, "target": {"model": "m"}, "host": {}, "server": {}, "definitions": DEFINITIONS,
           "error": "bad </script><script>alert(1)</script> \u2028", "variants": []}  # fmt: skip
    html = render_html(rec)
    data = re.search(r'<script type="application/json" id="bench-data">(.*?)</script>', html, re.S)
    assert data is not None
    assert json.loads(data.group(1))["error"] == rec["error"]  # exactly the record, once unescaped
    assert "<script>alert" not in html
    # nothing is fetched: no src/href to any URL, no CDN
    assert not re.search(r'(src|href)=["\\\']?https?:', html)
