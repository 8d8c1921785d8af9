"""ops/_prefill_attention: the blocked prefill attention against the one-row-per-task kernel it stands in for,
called directly so that every host runs it (the runtime picks it on AVX-512 hosts only)."""
import numpy as np
import pytest

from ops import _prefill_attention as PA
from ops.contrib_attention import _gqa_prefill_kernel

RNG = np.random.default_rng(11)
_NOQK = np.zeros((1, 1, 1, 1), np.float32)


def _case(S, H, kvH, D, Dv, past, totals, causal, window, softcap, bias_shape, sink_mode):
    B = len(past)
    L = max(totals) + 3
    q = RNG.standard_normal((B, S, H, D)).astype(np.float32)
    pk = RNG.standard_normal((B, kvH, L, D)).astype(np.float32)
    pv = RNG.standard_normal((B, kvH, L, Dv)).astype(np.float32)
    pk[:, :, max(totals):] = np.nan  # rows past every total are never read
    pv[:, :, max(totals):] = np.nan
    kbase = np.array([1, 0][:B], np.int64)
    bias = RNG.standard_normal(bias_shape).astype(np.float32) if bias_shape else np.zeros((1, 1, 1, 1), np.float32)
    sink = RNG.standard_normal(H).astype(np.float32)
    params = np.array([1 / np.sqrt(D), softcap], np.float32)
    args = (q, pk, pv, np.array(past, np.int64), np.array(totals, np.int64), kbase, params, causal, window, bias,
            bool(bias_shape), sink, sink_mode)
    want = np.full((B, S, H, Dv), np.nan, np.float32)
    _gqa_prefill_kernel(*args, _NOQK, 0, want)
    got = np.full((B, S, H, Dv), np.nan, np.float32)
    PA.attend_blocked(*args, got)
    return got, want


@pytest.mark.parametrize("causal,window,softcap,bias,sink_mode", [
    (True, -1, 0.0, False, 0), (False, -1, 0.0, False, 0), (True, 4, 0.0, False, 0),
    (True, -1, 5.0, True, 0), (True, 6, 0.0, True, 2), (False, -1, 0.0, False, 1)])
def test_blocked_matches_row_kernel(causal, window, softcap, bias, sink_mode):
    """Two batch entries with different pasts (a prompt, and new rows after 3 cached ones), a group of 2 and of
    1, 40 positions so a group's rows cross a task (64 rows), Dv != D."""
    S, B = 40, 2
    past, totals = [0, 3], [S, 3 + S]
    bias_shape = (B, 4, S, max(totals) + 1) if bias else None
    got, want = _case(S, 4, 2, 16, 32, past, totals, causal, window, softcap, bias_shape, sink_mode)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    got, want = _case(7, 3, 3, 32, 16, [2], [9], causal, window, softcap, None, sink_mode)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


def test_rows_without_keys_are_zero():
    got, want = _case(5, 2, 1, 16, 16, [0, 0], [0, 5], False, -1, 0.0, None, 0)
    assert np.all(got[0] == 0) and np.all(want[0] == 0)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=2e-6)


def test_usable_needs_whole_panels_and_no_scores_output():
    assert not PA.usable(24, 16, 0) and not PA.usable(16, 8, 0) and not PA.usable(16, 16, 1)
    assert PA.usable(64, 64, 0) == bool(PA.AVX512)


def _reference(q, pk, pv, past, totals, kbase, scale, causal, window, bias, sink):
    """Float64 attention written from the contract alone (no shared helper), sink_mode 2."""
    B, S, H, D = q.shape
    group = H // pk.shape[1]
    out = np.zeros((B, S, H, pv.shape[3]))
    for b in range(B):
        for s in range(S):
            p = past[b] + s
            hi = min(p + 1, totals[b]) if causal else totals[b]
            lo = max(0, p + 1 - window) if window > 0 else 0
            for h in range(H):
                keys = np.arange(lo, max(lo, hi))
                x = pk[b, h // group, keys].astype(np.float64) @ q[b, s, h].astype(np.float64) * scale
                x = x + bias[b, h, s, keys + kbase[b]]
                m = max(x.max(initial=-np.inf), sink[h])
                e = np.exp(x - m)
                out[b, s, h] = e @ pv[b, h // group, keys] / (e.sum() + np.exp(sink[h] - m))
    return out


def test_blocked_matches_a_float64_reference():
    S, H, kvH, D = 20, 4, 2, 16
    past, totals = np.array([0, 3]), np.array([S, 3 + S])
    q = RNG.standard_normal((2, S, H, D)).astype(np.float32)
    pk = RNG.standard_normal((2, kvH, 3 + S, D)).astype(np.float32)
    pv = RNG.standard_normal((2, kvH, 3 + S, 32)).astype(np.float32)
    bias = RNG.standard_normal((2, H, S, 3 + S + 1)).astype(np.float32)
    sink = RNG.standard_normal(H).astype(np.float32)
    kbase = np.array([1, 0], np.int64)
    params = np.array([1 / np.sqrt(D), 0.0], np.float32)
    got = np.empty((2, S, H, 32), np.float32)
    PA.attend_blocked(q, pk, pv, past, totals, kbase, params, True, 6, bias, True, sink, 2, got)
    want = _reference(q, pk, pv, past, totals, kbase, params[0], True, 6, bias, sink)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
