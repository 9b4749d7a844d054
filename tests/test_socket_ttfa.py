"""benchmarks/socket_ttfa.py on the CPU with the tiny checkpoint: it serves the real HTTP app on a Unix
socket, measures client-side time to first audio at two concurrency levels and writes its JSON."""
from __future__ import annotations

import json
import math
import subprocess
import sys

from daemon_util import CV, ROOT, needs_daemon

pytestmark = needs_daemon


def test_socket_ttfa_on_the_tiny_model(tmp_path):
    out, md = tmp_path / "ttfa.json", tmp_path / "ttfa.md"
    p = subprocess.run([sys.executable, "-m", "benchmarks.socket_ttfa", "--model", str(CV), "--device", "cpu",
                        "--threads", "1", "--concurrency", "1,2", "--frames", "6", "--requests", "2",
                        "--json", str(out), "--md", str(md)], cwd=ROOT, capture_output=True, text=True, timeout=600)  # (a guard: two imports of torch on a loaded machine)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert {"device", "device_type", "model", "dtype", "frames", "slots", "results"} <= set(r)
    assert r["device_type"] == "cpu" and r["model"] == "cv_small" and r["slots"] == 2 and r["device"]
    assert [x["concurrency"] for x in r["results"]] == [1, 2]
    for x in r["results"]:
        assert x["requests"] == 2 * x["concurrency"]
        for key in ("ttfa_p50_ms", "ttfa_p95_ms", "ttfa_mean_ms", "engine_ttfa_mean_ms", "audio_s_per_s"):
            assert math.isfinite(x[key]) and x[key] > 0, (key, x)
        assert x["ttfa_p50_ms"] <= x["ttfa_p95_ms"] <= x["ttfa_max_ms"]
    table = md.read_text()
    assert "| 1 | 2 |" in table and "| 2 | 4 |" in table and "TTFA p95" in table
