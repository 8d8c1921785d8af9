"""The KV-cache interface (``pipeline/kv_cache.py``) on bare arrays: each host policy keeps what a decoder
feeds back, grows within ``max_length``, rewinds, and refuses a bad present before writing anything."""
import numpy as np
import pytest

from pipeline.kv_cache import CacheSpec, CarriedKV, CopiedKV, SharedKV
from pipeline.spec import MetadataError

SPEC = CacheSpec((1, 2, 0, 3), 2, np.dtype(np.float32))  # (batch, heads, seq, head size)
NAMES = ("k", "win")


def _cache(policy, max_length=8, reach=None):
    c = policy(lambda name: SPEC, NAMES, {"win": 4}, max_length)
    if reach is not None:
        c.reserve(reach)
    return c


def _rows(start, stop):
    """Present rows [start, stop): row t holds t everywhere."""
    return np.broadcast_to(np.arange(start, stop, dtype=np.float32)[None, None, :, None], (1, 2, stop - start, 3))


def _step(c, seq_len):
    """One decoder step as a policy's decoder runs it: the present the graph would return for ``past``."""
    total = c.length + seq_len
    c.make_room(total)
    past = c.past("k")
    if isinstance(c, SharedKV):  # the step appends into the buffer it was fed
        past[:, :, c.length:total] = _rows(c.length, total)
        present = past
    else:  # a fresh present holding every live row
        present = np.concatenate([past[:, :, :c.length], _rows(c.length, total)], axis=2)
    c.store({"k": present, "win": np.full((1, 2, 4, 3), total, np.float32)}, seq_len)


@pytest.mark.parametrize("policy", [CopiedKV, CarriedKV, SharedKV])
def test_each_policy_feeds_back_every_live_row(policy):
    c = _cache(policy, reach=3)
    assert c.past("k").shape[2] == (3 if policy is SharedKV else 0)
    assert c.past("win").shape == (1, 2, 4, 3) and not c.past("win").any()  # zeros of the window's capacity
    for n in (3, 1, 1, 2):  # past the reserved reach: buffers grow, keeping their rows
        _step(c, n)
    assert c.length == 7
    r = c.rows["k"]
    np.testing.assert_array_equal(r.live(), _rows(0, 7))
    assert r.capacity == {CopiedKV: 8, CarriedKV: 7, SharedKV: 8}[policy]  # 3, doubled to 6, then capped at 8
    assert (c.past("win") == 7).all()
    assert c.in_place == (policy is SharedKV)
    with pytest.raises(ValueError, match="past max_length 8"):
        c.make_room(9)


@pytest.mark.parametrize("policy", [CopiedKV, CarriedKV, SharedKV])
def test_rewind_keeps_the_first_rows(policy):
    c = policy(lambda name: SPEC, ("k",), {}, 8)
    _step_plain = [3, 1, 1]
    for n in _step_plain:
        total = c.length + n
        c.make_room(total)
        past = c.past("k")
        if policy is SharedKV:
            past[:, :, c.length:total] = _rows(c.length, total)
            present = past
        else:
            present = np.concatenate([past[:, :, :c.length], _rows(c.length, total)], axis=2)
        c.store({"k": present}, n)
    c.rewind(3)
    assert c.length == 3
    np.testing.assert_array_equal(np.asarray(c.rows["k"].live()), _rows(0, 3))
    with pytest.raises(ValueError, match="cannot rewind to 4"):
        c.rewind(4)


def test_window_caches_cannot_rewind():
    c = _cache(CopiedKV)
    _step(c, 2)
    with pytest.raises(ValueError, match="sliding-window"):
        c.rewind(1)


@pytest.mark.parametrize("policy", [CopiedKV, SharedKV])
def test_a_bad_present_is_refused_before_anything_is_written(policy):
    c = policy(lambda name: SPEC, ("k", "v"), {}, 8)
    _step_two = {"k": None, "v": None}
    c.make_room(2)
    for n in _step_two:
        p = c.past(n)
        if policy is SharedKV:
            p[:, :, :2] = _rows(0, 2)
            _step_two[n] = p
        else:
            _step_two[n] = np.ascontiguousarray(_rows(0, 2))
    c.store(_step_two, 2)
    before = {n: np.array(r.buf) for n, r in c.rows.items()}
    good = np.ascontiguousarray(_rows(0, 3))
    for bad in (np.zeros((1, 3, 3, 3), np.float32), good.astype(np.float64), good[:, :, :2]):
        with pytest.raises(MetadataError, match="KV cache 'v'"):
            c.store({"k": good, "v": bad}, 1)
        assert c.length == 2
        for n, r in c.rows.items():
            np.testing.assert_array_equal(r.buf, before[n])


def test_shared_buffers_are_kept_across_requests_that_reach_as_far():
    c = _cache(SharedKV, reach=5)
    _step(c, 2)
    buf = c.rows["k"].buf
    c.reset()
    c.reserve(5)
    assert c.past("k") is buf and c.length == 0
    c.reserve(6)  # a request that reaches further gets buffers of its own size
    assert c.past("k") is not buf and c.past("k").shape[2] == 6
