"""tools/profile_native: one run per backend in turn, medians and ratios from the same runs."""
from __future__ import annotations

import os
import re

import pytest

from tools import profile_native

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "fixtures", "packages", "llama_fp32")


def test_profile_runs_backends_round_robin_and_reports_medians(capsys):
    pytest.importorskip("onnxruntime_genai")
    rc = profile_native.main(["--model", PKG, "--backend", "both", "--tokens", "6", "--runs", "2", "--warmups", "0",
                              "--prompt-ids", "1,5,9,4"])
    out = capsys.readouterr().out
    assert rc == 0, out
    order = re.findall(r"^run (\d+): backend=(\S+)", out, re.M)
    assert order == [("0", "native"), ("0", "ort"), ("0", "ort-genai"), ("1", "native"), ("1", "ort"),
                     ("1", "ort-genai")], out
    for be in ("native", "ort", "ort-genai"):
        m = re.search(rf"^steady_median: backend={be} prefill=([\d.]+) ms decode=([\d.]+) ms/token", out, re.M)
        assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, out
    assert re.search(r"^ratio native/ort-genai: prefill [\d.]+x decode [\d.]+x", out, re.M), out
