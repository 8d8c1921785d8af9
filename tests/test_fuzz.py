"""tools/fuzz.py: the harness tells every outcome apart, and a fixed-seed smoke of mutated node-suite models finds
no crash, hang, internal exception or mismatch (the campaigns in the notes run the same code on more cases)."""
from __future__ import annotations

from tools import fuzz


def test_worker_outcomes_are_classified():
    w = fuzz.Worker()
    try:
        assert w.run(("selftest", "crash", b"", {}), timeout=60)[0] == "crash"
        assert w.run(("selftest", "hang", b"", {}), timeout=3)[0] == "hang"
        outcome, detail = w.run(("bytes", "garbage", b"\x08\x07garbage", {}), timeout=60)
        assert outcome == "named" and "ModelParseError" in detail  # the worker came back after the two above
    finally:
        w.stop()


def test_fixed_seed_smoke(tmp_path):
    lines = []
    counts = fuzz.campaign(150, seed=0, out=str(tmp_path), log=lines.append)
    assert sum(counts.values()) == 150
    bad = {k: counts[k] for k in ("internal", "mismatch", "crash", "hang") if counts[k]}
    assert not bad, "\n".join(lines)
    assert counts["success"] > 10 and counts["named"] > 10  # the mutations both keep and break models
