"""tools/int4_accuracy's measures on logits given in code (no package, no session)."""
import numpy as np
import pytest

from tools import int4_accuracy as A


def test_top1_agreement_and_kl():
    ref = np.array([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]])
    assert A.compare(ref, ref) == (1.0, 0.0)
    top1, kl = A.compare(ref, np.array([[0.0, 2.0, 0.0], [0.0, 3.0, 0.0]]))
    assert top1 == 0.5
    p = np.exp(ref[0]) / np.exp(ref[0]).sum()
    q = np.exp([0.0, 2.0, 0.0]) / np.exp([0.0, 2.0, 0.0]).sum()
    assert kl == pytest.approx((p * np.log(p / q)).sum() / 2, rel=1e-12)


class _In:
    def __init__(self, name, shape):
        self.name, self.shape = name, shape


def test_prefill_feeds_of_a_dense_decoder():
    ids = np.array([5, 6, 7], np.int64)
    f = A.feeds([_In("input_ids", ["b", "s"]), _In("attention_mask", ["b", "t"]), _In("position_ids", ["b", "s"]),
                 _In("past_key_values.0.key", ["b", 2, "p", 8])], ids, 8)
    assert f["input_ids"].tolist() == [[5, 6, 7]] and f["attention_mask"].tolist() == [[1, 1, 1]]
    assert f["position_ids"].tolist() == [[0, 1, 2]] and f["past_key_values.0.key"].shape == (1, 2, 0, 8)
    with pytest.raises(SystemExit, match="pixel_values"):
        A.feeds([_In("pixel_values", ["b", 3, 4, 4])], ids, 8)
    r = A.token_ids("", 50, random=True, vocab=9)
    assert r.shape == (50,) and r.min() >= 1 and r.max() < 9
