"""Classic-ML ops of the ``ai.onnx.ml`` domain: LabelEncoder, TreeEnsemble, TreeEnsembleRegressor,
TreeEnsembleClassifier, ArrayFeatureExtractor, Binarizer.

LabelEncoder maps through a dictionary built at plan time (keys and values
may be strings, so it stays in Python; float keys match NaN to NaN).
TreeEnsemble flattens the trees into typed arrays once at plan time and
walks them in one float64 kernel that compiles a single specialization;
BRANCH_MEMBER sets are taken from ``membership_values`` in node order.
TreeEnsembleRegressor / TreeEnsembleClassifier (versions 1 and 3) map their
(treeid, nodeid) pairs to flat indices at plan time, refusing dangling ids,
cycles and out-of-range ids before any kernel reads memory, and walk them in
one kernel specialized for float32 or float64 (onnxruntime's threshold type);
their outputs reproduce onnxruntime's CPU kernels, quirks included (see the
section note and the finishing kernels' docstrings).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from runtime.errors import IndexOutOfRangeError, InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import check_indices
from .registry import op

__all__ = ["LabelEncoder", "TreeEnsemble", "TreeEnsembleRegressor", "TreeEnsembleClassifier", "ArrayFeatureExtractor",
           "Binarizer"]
ML = "ai.onnx.ml"
OBJ = np.dtype(object)


def _s(v):
    return v.decode("utf-8", errors="surrogateescape") if isinstance(v, bytes) else v


# -- LabelEncoder --------------------------------------------------------------------------------

def _label_encoder(ctx, attrs):
    def pick(kind):
        for name in (f"{kind}_int64s", f"{kind}_strings", f"{kind}_floats", f"{kind}_tensor"):
            v = attrs.get(name)
            if v is not None:
                return name, v
        raise InvalidAttributeError(f"LabelEncoder needs one of the {kind}_* attributes")

    kname, keys = pick("keys")
    vname, values = pick("values")
    if vname == "values_tensor":
        odt = values.dtype if values.dtype != OBJ else OBJ
        values = [_s(v) for v in values.reshape(-1).tolist()]
        dflt = attrs.get("default_tensor")
        if dflt is not None:
            default = _s(np.asarray(dflt).reshape(-1)[0].item() if np.asarray(dflt).dtype != OBJ
                         else np.asarray(dflt).reshape(-1)[0])
        else:
            default = "_Unused" if odt == OBJ else (-1 if odt.kind in "iu" else -0.0)
    elif vname == "values_strings":
        odt, default = OBJ, attrs.get("default_string", "_Unused")
    elif vname == "values_int64s":
        odt, default = np.dtype(np.int64), attrs.get("default_int64", -1)
    else:
        odt, default = np.dtype(np.float32), attrs.get("default_float", -0.0)
    if kname == "keys_tensor":
        keys = [_s(k) for k in keys.reshape(-1).tolist()]
    if len(keys) != len(values):
        raise InvalidAttributeError(f"LabelEncoder: {len(keys)} keys but {len(values)} values")
    table = {}
    nan_value = None
    for k, v in zip(keys, values):
        if isinstance(k, float) and math.isnan(k):
            nan_value = v
        else:
            table[k] = v

    def run(X):
        flat = X.reshape(-1)
        out = np.empty(flat.shape[0], odt)
        get = table.get
        if X.dtype == OBJ or X.dtype.kind in "US":
            for i, x in enumerate(flat):
                out[i] = get(_s(x), default)
        elif X.dtype.kind == "f":
            for i, x in enumerate(flat.tolist()):
                out[i] = nan_value if (x != x and nan_value is not None) else get(x, default)
        else:
            for i, x in enumerate(flat.tolist()):
                out[i] = get(x, default)
        return out.reshape(X.shape)
    return run


@op("LabelEncoder", 1, domain=ML, factory=True)
def LabelEncoder(ctx, **attrs):
    allowed = {"default_float", "default_int64", "default_string", "default_tensor", "keys_floats", "keys_int64s",
               "keys_strings", "keys_tensor", "values_floats", "values_int64s", "values_strings", "values_tensor",
               "classes_strings"}
    bad = set(attrs) - allowed
    if bad:
        raise InvalidAttributeError(f"LabelEncoder: unexpected attribute(s) {sorted(bad)}")
    if "classes_strings" in attrs:  # opset 1: string <-> int through the class list
        cls = [_s(c) for c in attrs["classes_strings"]]
        attrs = dict(attrs)
        attrs["keys_strings"], attrs["values_int64s"] = cls, list(range(len(cls)))
    return _label_encoder(ctx, attrs)


# -- TreeEnsemble --------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _tree_kernel(X, modes, feats, splits, tnode, fnode, tleaf, fleaf, miss_true, mstart, mend, members,
                 leaf_target, leaf_weight, roots, agg, out):
    n, nt = out.shape
    cnt = np.zeros(nt, np.int64)
    for r in range(n):
        for k in range(nt):
            out[r, k] = 0.0
            cnt[k] = 0
        for t in range(roots.shape[0]):
            node = roots[t]
            while True:
                x = X[r, feats[node]]
                m = modes[node]
                if x != x:
                    c = miss_true[node]
                elif m == 0:
                    c = x <= splits[node]
                elif m == 1:
                    c = x < splits[node]
                elif m == 2:
                    c = x >= splits[node]
                elif m == 3:
                    c = x > splits[node]
                elif m == 4:
                    c = x == splits[node]
                elif m == 5:
                    c = x != splits[node]
                else:
                    c = False
                    for q in range(mstart[node], mend[node]):
                        if members[q] == x:
                            c = True
                            break
                if c:
                    nxt = tnode[node]
                    leaf = tleaf[node]
                else:
                    nxt = fnode[node]
                    leaf = fleaf[node]
                if leaf:
                    k = leaf_target[nxt]
                    w = leaf_weight[nxt]
                    if agg == 2:
                        out[r, k] = w if cnt[k] == 0 else min(out[r, k], w)
                    elif agg == 3:
                        out[r, k] = w if cnt[k] == 0 else max(out[r, k], w)
                    else:
                        out[r, k] += w
                    cnt[k] += 1
                    break
                node = nxt
        if agg == 0:
            for k in range(nt):
                out[r, k] /= roots.shape[0]


@njit(cache=True, nogil=True)
def _probit_all(y, out):
    """onnxruntime's PROBIT (``_probit32``, in float32) of every element of ``y`` into ``out``."""
    flat, dst = y.ravel(), out.ravel()
    for k in range(flat.shape[0]):
        dst[k] = _probit32(np.float32(flat[k]))


def _post(y, post_transform):
    if post_transform == 0:
        return y
    if post_transform == 1:
        e = np.exp(y - y.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if post_transform == 2:
        return 1.0 / (1.0 + np.exp(-y))
    if post_transform == 3:
        e = np.where(y == 0, 0.0, np.exp(y - y.max(axis=1, keepdims=True)))
        s = e.sum(axis=1, keepdims=True)
        return np.where(s == 0, 0.0, e / np.where(s == 0, 1.0, s))
    if post_transform == 4:
        out = np.empty(y.shape, np.float32)
        _probit_all(np.ascontiguousarray(y), out)
        return out
    raise InvalidAttributeError(f"TreeEnsemble: post_transform must be 0..4, got {post_transform}")


def _no_cycle(roots, tnode, fnode, tleaf, fleaf, op="TreeEnsemble", name=str) -> None:
    """Refuse branch links that lead back to a node on the way (the walk would never reach a leaf).

    ``name(i)`` spells flat node ``i`` in the message (the plain index by default).
    """
    state = np.zeros(tnode.shape[0], np.int8)  # 0 unseen, 1 on the current path, 2 done
    for root in roots.tolist():
        if state[root]:
            continue
        stack = [(root, 0)]
        state[root] = 1
        while stack:
            node, k = stack.pop()
            if k == 2:
                state[node] = 2
                continue
            stack.append((node, k + 1))
            leaf, nxt = (tleaf[node], tnode[node]) if k == 0 else (fleaf[node], fnode[node])
            if leaf:
                continue
            if state[nxt] == 1:
                raise InvalidAttributeError(f"{op}: node {name(node)} branches back to node {name(int(nxt))}, "
                                            f"which is on its own path from root {name(root)}: the trees must not "
                                            f"have cycles")
            if state[nxt] == 0:
                state[nxt] = 1
                stack.append((int(nxt), 0))


@op("TreeEnsemble", 5, domain=ML, factory=True)
def TreeEnsemble(ctx, *, leaf_targetids, leaf_weights, nodes_falseleafs, nodes_falsenodeids, nodes_featureids,
                 nodes_modes, nodes_splits, nodes_trueleafs, nodes_truenodeids, tree_roots, aggregate_function=1,
                 membership_values=None, n_targets=None, nodes_hitrates=None, nodes_missing_value_tracks_true=None,
                 post_transform=0):
    i64 = lambda v: np.ascontiguousarray(np.asarray(v).reshape(-1), np.int64)  # noqa: E731
    modes = i64(nodes_modes)
    nn = modes.shape[0]
    feats, tnode, fnode = i64(nodes_featureids), i64(nodes_truenodeids), i64(nodes_falsenodeids)
    tleaf = i64(nodes_trueleafs).astype(np.bool_)
    fleaf = i64(nodes_falseleafs).astype(np.bool_)
    splits = np.ascontiguousarray(np.asarray(nodes_splits).reshape(-1), np.float64)
    miss = (np.zeros(nn, np.bool_) if nodes_missing_value_tracks_true is None
            else i64(nodes_missing_value_tracks_true).astype(np.bool_))
    targets = i64(leaf_targetids)
    weights = np.ascontiguousarray(np.asarray(leaf_weights).reshape(-1), np.float64)
    roots = i64(tree_roots)
    if aggregate_function not in (0, 1, 2, 3):
        raise InvalidAttributeError(f"TreeEnsemble: aggregate_function must be 0..3, got {aggregate_function}")
    nt = int(n_targets) if n_targets else (int(targets.max()) + 1 if targets.size else 1)
    for name, arr in (("nodes_featureids", feats), ("nodes_truenodeids", tnode), ("nodes_falsenodeids", fnode),
                      ("nodes_splits", splits), ("nodes_trueleafs", tleaf), ("nodes_falseleafs", fleaf),
                      ("nodes_missing_value_tracks_true", miss)):
        if arr.shape[0] != nn:
            raise InvalidAttributeError(f"TreeEnsemble: {name} has {arr.shape[0]} entries, expected {nn}")
    nleaf = targets.shape[0]
    if weights.shape[0] != nleaf:
        raise InvalidAttributeError(f"TreeEnsemble: {weights.shape[0]} leaf_weights for {nleaf} leaf_targetids")
    check_indices("TreeEnsemble", roots, 0, max(nn, 1), "tree root")
    check_indices("TreeEnsemble", targets, 0, nt, "leaf target id")
    check_indices("TreeEnsemble", tnode[~tleaf], 0, nn, "true node id")
    check_indices("TreeEnsemble", fnode[~fleaf], 0, nn, "false node id")
    check_indices("TreeEnsemble", tnode[tleaf], 0, nleaf, "true leaf id")
    check_indices("TreeEnsemble", fnode[fleaf], 0, nleaf, "false leaf id")
    _no_cycle(roots, tnode, fnode, tleaf, fleaf)
    mstart = np.zeros(nn, np.int64)
    mend = np.zeros(nn, np.int64)
    members = np.empty(0, np.float64)
    if (modes == 6).any():
        if membership_values is None:
            raise InvalidAttributeError("TreeEnsemble: BRANCH_MEMBER nodes need membership_values")
        members = np.ascontiguousarray(np.asarray(membership_values).reshape(-1), np.float64)
        seps = np.flatnonzero(np.isnan(members))
        member_nodes = np.flatnonzero(modes == 6)
        if len(seps) < len(member_nodes):
            raise InvalidAttributeError(f"TreeEnsemble: {len(member_nodes)} BRANCH_MEMBER nodes but only "
                                        f"{len(seps)} NaN-terminated sets in membership_values")
        start = 0
        for node, sep in zip(member_nodes, seps):
            mstart[node], mend[node] = start, sep
            start = sep + 1

    def run(X):
        if X.dtype.kind != "f":
            raise InvalidArgumentError(f"TreeEnsemble expects a floating-point input, got {X.dtype}")
        X2 = X.reshape(1, -1) if X.ndim == 1 else X.reshape(X.shape[0], -1)
        if nn and int(feats.max()) >= X2.shape[1]:
            from runtime.errors import IndexOutOfRangeError
            raise IndexOutOfRangeError(f"TreeEnsemble: feature id {int(feats.max())} is out of bounds for "
                                       f"{X2.shape[1]} features")
        out = np.empty((X2.shape[0], nt), np.float64)
        _tree_kernel(np.ascontiguousarray(X2, np.float64), modes, feats, splits, tnode, fnode, tleaf, fleaf, miss,
                     mstart, mend, members, targets, weights, roots, int(aggregate_function), out)
        return _post(out, post_transform).astype(X.dtype)
    return run


# -- TreeEnsembleRegressor / TreeEnsembleClassifier (ai.onnx.ml 1 and 3) ------------------------
#
# Plan time flattens the (treeid, nodeid) pairs into flat node indices: every branch stores the flat index
# of its true and false child, a leaf points at itself, and the (target or class, weight) entries of a leaf
# are the contiguous range wstart[leaf] .. wstart[leaf] + wcount[leaf] of wtarget / wvalue, in attribute
# order.  The walk needs no lookup, and every index it reads was validated before the first run.
#
# Precision follows onnxruntime's ThresholdType: double for a double input, float for every other input
# (an int32 / int64 input is compared as float, as C++ compares an integer with a float threshold), so the
# thresholds, the weights and the accumulated scores are float64 or float32 to match; the post transforms
# run in float32 as onnxruntime's ComputeLogistic / ComputeSoftmax / ComputeProbit do.

_V3_MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4, "BRANCH_NEQ": 5,
             "LEAF": 6}
_V3_LEAF = 6
_V3_POST = {"NONE": 0, "SOFTMAX": 1, "LOGISTIC": 2, "SOFTMAX_ZERO": 3, "PROBIT": 4}  # the numbering of _post
_V3_AGG = {"AVERAGE": 0, "SUM": 1, "MIN": 2, "MAX": 3}
_F1 = np.float32(1.0)
_F0 = np.float32(0.0)
_F_HALF = np.float32(0.5)
_F_SQRT2 = np.float32(math.sqrt(2.0))
_F_WIN_A = np.float32(2.0) / (np.float32(math.pi) * np.float32(0.147))
_F_WIN_B = np.float32(1.0) / np.float32(0.147)
_F_EPS7 = np.float32(0.0000001)
_F_LOWEST = np.float32(-3.4028234663852886e38)


@njit(cache=True, nogil=True)
def _logistic32(v):
    """onnxruntime's ComputeLogistic in float32: 1 / (1 + exp(-|v|)), mirrored as 1 - that for v < 0."""
    p = _F1 / (_F1 + np.exp(-abs(v)))
    return _F1 - p if v < 0 else p


@njit(cache=True, nogil=True)
def _probit32(v):
    """onnxruntime's ComputeProbit in float32: sqrt(2) * ErfInv(2v - 1), ErfInv being Winitzki's approximation
    with a = 0.147 (TreeEnsemble 5's PROBIT too)."""
    x = np.float32(2.0) * v - _F1
    sgn = np.float32(-1.0) if x < 0 else _F1
    x = (_F1 - x) * (_F1 + x)
    lg = np.log(x)
    a = _F_WIN_A + _F_HALF * lg
    b = _F_WIN_B * lg
    return _F_SQRT2 * (sgn * np.sqrt(-a + np.sqrt(a * a - b)))


@njit(cache=True, nogil=True, error_model="numpy")
def _v3_write(v, n, post, z):
    """onnxruntime's write_scores for two or more scores: ``v[:n]`` (float32, a class without a score already
    0) transformed into ``z``.  SOFTMAX_ZERO scales a score within 1e-7 of zero by exp(-max) instead of
    exponentiating it, and an all-zero row divides 0 by 0 (NaN), as onnxruntime does."""
    if post == 4:
        for k in range(n):
            z[k] = _probit32(v[k])
    elif post == 2:
        for k in range(n):
            z[k] = _logistic32(v[k])
    elif post == 1 or post == 3:
        vmax = _F_LOWEST
        for k in range(n):
            if v[k] > vmax:
                vmax = v[k]
        eneg = np.exp(-vmax)
        total = _F0
        for k in range(n):
            if post == 1 or v[k] > _F_EPS7 or v[k] < -_F_EPS7:
                e = np.exp(v[k] - vmax)
                total += e
            else:
                e = v[k] * eneg
            z[k] = e
        for k in range(n):
            z[k] = z[k] / total
    else:
        for k in range(n):
            z[k] = v[k]


@njit(cache=True, nogil=True)
def _v3_walk(X, feats, thr, modes, tnext, fnext, miss, roots, wstart, wcount, wtarget, wvalue, uniq, agg, one,
             scores, has):
    """Walk every tree for every row of ``X`` and aggregate its leaf into ``scores`` / ``has`` (one per output).

    X, thr, wvalue, uniq and scores share one dtype (float32 or float64); a branch goes true when
    ``x CMP threshold`` or (``miss`` and x is NaN), so a NaN goes true at BRANCH_NEQ whatever ``miss`` says.
    ``agg`` 0 AVERAGE and 1 SUM add, 2 MIN and 3 MAX keep the extreme (the first value a target sees is
    taken whole).  ``one`` is onnxruntime's single-output path: a leaf contributes only ``uniq[leaf]`` (its
    first weight, or its node value when it has none) whatever its target, and SUM / AVERAGE leave ``has``
    unset; otherwise a leaf adds each of its entries to its target and marks it.
    """
    n = X.shape[0]
    nout = scores.shape[1]
    for r in range(n):
        for k in range(nout):
            scores[r, k] = 0
            has[r, k] = False
        for t in range(roots.shape[0]):
            node = roots[t]
            while modes[node] != 6:
                x = X[r, feats[node]]
                th = thr[node]
                m = modes[node]
                if m == 0:
                    c = x <= th
                elif m == 1:
                    c = x < th
                elif m == 2:
                    c = x >= th
                elif m == 3:
                    c = x > th
                elif m == 4:
                    c = x == th
                else:
                    c = x != th
                if c or (miss[node] and x != x):
                    node = tnext[node]
                else:
                    node = fnext[node]
            if one:
                v = uniq[node]
                if agg == 2:
                    if not has[r, 0] or v < scores[r, 0]:
                        scores[r, 0] = v
                    has[r, 0] = True
                elif agg == 3:
                    if not has[r, 0] or v > scores[r, 0]:
                        scores[r, 0] = v
                    has[r, 0] = True
                else:
                    scores[r, 0] += v
            else:
                for j in range(wstart[node], wstart[node] + wcount[node]):
                    k = wtarget[j]
                    v = wvalue[j]
                    if agg == 2:
                        if not has[r, k] or v < scores[r, k]:
                            scores[r, k] = v
                    elif agg == 3:
                        if not has[r, k] or v > scores[r, k]:
                            scores[r, k] = v
                    else:
                        scores[r, k] += v
                    has[r, k] = True


@njit(cache=True, nogil=True, error_model="numpy")
def _v3_finish_regressor(scores, has, agg, ntrees, base, origin, one, post, Z):
    """onnxruntime's TreeAggregator{Sum,Average,Min,Max} FinalizeScores into float32 ``Z``.

    ``base`` has one entry per target (zeros unless base_values has exactly that length); ``origin`` is
    base_values[0] when it has exactly one entry, else 0; ``ntrees`` is of the scores' dtype.  With one
    target only PROBIT is applied (onnxruntime's FinalizeScores1 ignores the other transforms); with several,
    a target no leaf reached is written as 0 before the transform, its base value dropped.
    """
    n, nout = scores.shape
    buf = np.empty(nout, np.float32)
    for r in range(n):
        if one:
            s = scores[r, 0] / ntrees + origin if agg == 0 else scores[r, 0] + origin
            Z[r, 0] = _probit32(np.float32(s)) if post == 4 else np.float32(s)
            continue
        for k in range(nout):
            if has[r, k]:
                s = scores[r, k] / ntrees + base[k] if agg == 0 else scores[r, k] + base[k]
                buf[k] = np.float32(s)
            else:
                buf[k] = _F0
        _v3_write(buf, nout, post, Z[r])


@njit(cache=True, nogil=True, error_model="numpy")
def _v3_finish_classifier(scores, has, base, post, binary_case, all_positive, Z, label):
    """onnxruntime's TreeAggregatorClassifier::FinalizeScores: float32 ``Z`` and the label index per row.

    More than two classes: base_values[k] is added to (or starts) class k; the label is the first class with
    the highest score among those that have one (-1 when none has).

    Two classes follow onnxruntime's binary rules.  base_values of length 2 make score1 = base1 + score0 and
    score0 = -score1 once class 1 has a score (else each class adds its own base value); length 1 adds to
    class 0.  Without class 1 scored (length 0 or 1) the row keeps one score s and column 1 is derived from
    it.  The label weighs score1 if class 1 has a score, else score0.  In the binary case (one distinct id in
    class_ids) it is compared with 0.5 when every weight is >= 0, giving columns [1 - s, s] (LOGISTIC:
    [1 - sigmoid(s), sigmoid(s)], as onnxruntime >= 1.26 writes), and with 0 otherwise, giving [-s, s]
    (LOGISTIC: [sigmoid(-s), sigmoid(s)]).  With both class ids used the label index is 1 if the weighed
    score is > 0 else 0, and a one-score row writes s alone.  PROBIT on a one-score row writes probit(s)
    alone.  Where onnxruntime leaves column 1 unwritten, it is 0 here.
    """
    n, nc = scores.shape
    nb = base.shape[0]
    buf = np.empty(nc, np.float32)
    for r in range(n):
        if nc > 2:
            for k in range(nb):
                if has[r, k]:
                    scores[r, k] += base[k]
                else:
                    scores[r, k] = base[k]
                    has[r, k] = True
            best = -1
            for k in range(nc):
                if has[r, k] and (best == -1 or scores[r, k] > scores[r, best]):
                    best = k
            label[r] = best  # -1: no class has a score (every leaf reached had no weight, no base_values)
            for k in range(nc):
                buf[k] = np.float32(scores[r, k]) if has[r, k] else _F0
            _v3_write(buf, nc, post, Z[r])
            continue
        s0 = scores[r, 0]
        s1 = scores[r, 1]
        h0 = has[r, 0]
        h1 = has[r, 1]
        size = 2
        wa = -1
        if nb == 2:
            if h1:
                s1 = base[1] + s0
                s0 = -s1
            else:
                s1 = s1 + base[1]
                s0 = s0 + base[0]
        elif nb == 1:
            s0 = s0 + base[0]
            if not h1:
                size = 1
        elif nb == 0:
            wa = 3
            if not h1:
                size = 1
        if size == 2 and h1:
            pos = np.float64(s1)
        else:
            pos = np.float64(s0) if h0 else 0.0
        if binary_case:
            if all_positive:
                wa = 0 if pos > 0.5 else 1
                lab = 1 if pos > 0.5 else 0
            else:
                wa = 2 if pos > 0 else 3
                lab = 1 if pos > 0 else 0
        else:
            lab = 1 if pos > 0 else 0
        label[r] = lab
        if size == 2:
            buf[0] = np.float32(s0) if h0 else _F0
            buf[1] = np.float32(s1) if h1 else _F0
            _v3_write(buf, 2, post, Z[r])
            continue
        v = np.float32(s0) if h0 else _F0
        if post == 4:
            Z[r, 0] = _probit32(v)
            Z[r, 1] = _F0
        elif wa == 0 or wa == 1:
            if post == 2:
                p = _logistic32(v)
                Z[r, 0] = _F1 - p
                Z[r, 1] = p
            else:
                Z[r, 0] = _F1 - v
                Z[r, 1] = v
        elif wa == 2 or wa == 3:
            if post == 2:
                Z[r, 0] = _logistic32(-v)
                Z[r, 1] = _logistic32(v)
            else:
                Z[r, 0] = -v
                Z[r, 1] = v
        else:
            Z[r, 0] = v
            Z[r, 1] = _F0


class _Forest:
    """The flattened trees of one TreeEnsembleRegressor / TreeEnsembleClassifier node (see _v3_forest)."""

    __slots__ = ("op", "feats", "modes", "tnext", "fnext", "miss", "roots", "wstart", "wcount", "wtarget",
                 "max_feat", "f32", "f64")

    def typed(self, dtype):
        """(thresholds, leaf weights, unique leaf weights, base values) in ``dtype`` (float32 or float64)."""
        return self.f64 if dtype == np.float64 else self.f32

    def prepare(self, X):
        """``X`` as a contiguous 2-d float32 / float64 array (onnxruntime's ThresholdType) after checking it."""
        if X.ndim not in (1, 2):
            raise InvalidArgumentError(f"{self.op} expects X of shape [N, F] or [F], got shape {X.shape}")
        if X.dtype == np.float64 or X.dtype == np.float32:
            dt = X.dtype
        elif X.dtype == np.int64 or X.dtype == np.int32:
            dt = np.dtype(np.float32)  # onnxruntime compares an integer input with float thresholds as float
        else:
            raise InvalidArgumentError(f"{self.op} expects a float, double, int64 or int32 input, got {X.dtype}")
        X2 = X.reshape(1, -1) if X.ndim == 1 else X
        if self.max_feat >= X2.shape[1]:
            raise IndexOutOfRangeError(f"{self.op}: feature id {self.max_feat} is out of bounds for "
                                       f"{X2.shape[1]} features")
        return np.ascontiguousarray(X2, dt)

    def walk(self, X2, agg, one, nout):
        thr, wvalue, uniq, _ = self.typed(X2.dtype)
        scores = np.empty((X2.shape[0], nout), X2.dtype)
        has = np.empty((X2.shape[0], nout), np.bool_)
        _v3_walk(X2, self.feats, thr, self.modes, self.tnext, self.fnext, self.miss, self.roots, self.wstart,
                 self.wcount, self.wtarget, wvalue, uniq, agg, one, scores, has)
        return scores, has


def _v3_attr_values(op, what, floats, tensor, n=None, required=True):
    """A float attribute given as a float list or (version 3) as a ``*_as_tensor`` tensor, as float64."""
    if floats is not None and tensor is not None and len(floats) and np.asarray(tensor).size:
        raise InvalidAttributeError(f"{op}: give either {what} or {what}_as_tensor, not both")
    if tensor is not None and np.asarray(tensor).size:
        arr = np.asarray(tensor)
        if arr.dtype.kind != "f":
            raise InvalidAttributeError(f"{op}: {what}_as_tensor must be a float or double tensor, got {arr.dtype}")
        vals = arr.reshape(-1).astype(np.float64)
    elif floats is not None:
        vals = np.asarray(floats, np.float64).reshape(-1)
    elif required and n:
        raise InvalidAttributeError(f"{op}: {what} (or {what}_as_tensor) is required")
    else:
        vals = np.empty(0, np.float64)
    if n is not None and vals.shape[0] != n and (required or vals.shape[0]):
        raise InvalidAttributeError(f"{op}: {what} has {vals.shape[0]} entries, expected {n}")
    return vals


def _v3_forest(op, nout, out_what, *, nodes_treeids, nodes_nodeids, nodes_featureids, nodes_modes, nodes_values,
               nodes_values_as_tensor, nodes_truenodeids, nodes_falsenodeids, nodes_missing_value_tracks_true,
               w_prefix, w_treeids, w_nodeids, w_ids, w_weights, w_weights_as_tensor, base_values,
               base_values_as_tensor):
    """Validate and flatten the node and weight attributes of the version 1 / 3 tree ops (see the section note).

    Mirrors onnxruntime's TreeEnsembleCommon::Init: a tree's root is the first node of each run of equal
    tree ids in node order; weight entries on branch nodes are ignored; a leaf's entries keep attribute
    order.  Refused, before any kernel runs: unknown modes, duplicate (tree, node) pairs, a branch naming a
    node its tree lacks or itself, a weight entry naming a missing node, ids out of [0, nout), negative
    feature ids and cycles.
    """
    i64 = lambda v: np.asarray([] if v is None else v, np.int64).reshape(-1)  # noqa: E731
    tree = i64(nodes_treeids)
    nn = tree.shape[0]
    nid = i64(nodes_nodeids)
    feats = i64(nodes_featureids)
    tids = i64(nodes_truenodeids)
    fids = i64(nodes_falsenodeids)
    mode_names = list(nodes_modes or [])
    for name, arr in (("nodes_nodeids", nid), ("nodes_featureids", feats), ("nodes_truenodeids", tids),
                      ("nodes_falsenodeids", fids), ("nodes_modes", mode_names)):
        if len(arr) != nn:
            raise InvalidAttributeError(f"{op}: {name} has {len(arr)} entries, expected {nn} (one per node)")
    bad = sorted({m for m in mode_names if m not in _V3_MODES})
    if bad:
        raise InvalidAttributeError(f"{op}: unknown node mode(s) {bad}; expected one of {sorted(_V3_MODES)}")
    modes = np.array([_V3_MODES[m] for m in mode_names], np.int8)
    values = _v3_attr_values(op, "nodes_values", nodes_values, nodes_values_as_tensor, nn)
    miss_in = i64(nodes_missing_value_tracks_true)[:nn]
    miss = np.zeros(nn, np.bool_)
    miss[:miss_in.shape[0]] = miss_in == 1  # onnxruntime: a shorter list leaves the rest false
    index = {}
    for i, key in enumerate(zip(tree.tolist(), nid.tolist())):
        if key in index:
            raise InvalidAttributeError(f"{op}: node {key[1]} of tree {key[0]} is defined twice")
        index[key] = i

    def name(i):
        return f"{int(nid[i])} of tree {int(tree[i])}"

    leaf = modes == _V3_LEAF
    tnext = np.arange(nn, dtype=np.int64)
    fnext = np.arange(nn, dtype=np.int64)
    for i in np.flatnonzero(~leaf).tolist():
        for what, ids, nxt in (("true", tids, tnext), ("false", fids, fnext)):
            j = index.get((int(tree[i]), int(ids[i])))
            if j is None:
                raise InvalidAttributeError(f"{op}: node {int(ids[i])} of tree {int(tree[i])} does not exist, "
                                            f"but node {name(i)} names it as its {what} branch")
            if j == i:
                raise InvalidAttributeError(f"{op}: node {name(i)} names itself as its {what} branch")
            nxt[i] = j
    check_indices(op, feats[~leaf], 0, np.iinfo(np.int64).max, "feature id")
    roots = np.flatnonzero(np.r_[True, tree[1:] != tree[:-1]]).astype(np.int64) if nn else np.empty(0, np.int64)
    _no_cycle(roots, tnext, fnext, leaf[tnext], leaf[fnext], op=op, name=name)

    wt = i64(w_treeids)
    wn = i64(w_nodeids)
    wid = i64(w_ids)
    nw = wid.shape[0]
    for nm, arr in ((f"{w_prefix}_treeids", wt), (f"{w_prefix}_nodeids", wn)):
        if arr.shape[0] != nw:
            raise InvalidAttributeError(f"{op}: {nm} has {arr.shape[0]} entries, expected {nw} (one per "
                                        f"{w_prefix}_ids entry)")
    wval = _v3_attr_values(op, f"{w_prefix}_weights", w_weights, w_weights_as_tensor, nw)
    check_indices(op, wid, 0, nout, f"{out_what} id")
    wnode = np.empty(nw, np.int64)
    for j, key in enumerate(zip(wt.tolist(), wn.tolist())):
        i = index.get(key)
        if i is None:
            raise InvalidAttributeError(f"{op}: {w_prefix} entry {j} names node {key[1]} of tree {key[0]}, "
                                        f"which does not exist")
        wnode[j] = i
    keep = np.flatnonzero(leaf[wnode]) if nw else np.empty(0, np.int64)  # onnxruntime ignores branch weights
    keep = keep[np.argsort(wnode[keep], kind="stable")]
    wcount = np.bincount(wnode[keep], minlength=nn).astype(np.int64)
    wstart = (np.cumsum(wcount) - wcount).astype(np.int64)
    uniq = values.copy()  # onnxruntime's value_or_unique_weight: a leaf's first weight, else its node value
    has_w = wcount > 0
    uniq[has_w] = wval[keep][wstart[has_w]]
    base = _v3_attr_values(op, "base_values", base_values, base_values_as_tensor, required=False)

    f = _Forest()
    f.op = op
    f.feats, f.modes, f.tnext, f.fnext, f.miss, f.roots = feats, modes, tnext, fnext, miss, roots
    f.wstart, f.wcount, f.wtarget = wstart, wcount, np.ascontiguousarray(wid[keep])
    f.max_feat = int(feats[~leaf].max()) if (~leaf).any() else -1
    typed = (values, np.ascontiguousarray(wval[keep]), uniq, base)
    f.f64 = tuple(np.ascontiguousarray(a, np.float64) for a in typed)
    f.f32 = tuple(np.ascontiguousarray(a, np.float32) for a in typed)
    return f, wid, wval


def _v3_enum(op, what, value, table):
    v = value.decode() if isinstance(value, bytes) else value
    if v not in table:
        raise InvalidAttributeError(f"{op}: {what} must be one of {sorted(table)}, got {v!r}")
    return table[v]


@op("TreeEnsembleRegressor", 3, domain=ML, factory=True)
@op("TreeEnsembleRegressor", 1, domain=ML, factory=True)
def TreeEnsembleRegressor(ctx, *, aggregate_function="SUM", base_values=None, base_values_as_tensor=None,
                          n_targets=None, nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                          nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None, nodes_modes=None,
                          nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None, nodes_values=None,
                          nodes_values_as_tensor=None, post_transform="NONE", target_ids=None, target_nodeids=None,
                          target_treeids=None, target_weights=None, target_weights_as_tensor=None):
    """Y [N, n_targets] float32, onnxruntime's TreeEnsembleRegressor (CPU) semantics.

    One target takes onnxruntime's single-output path (each leaf's first weight only, only PROBIT applied,
    base_values used only when it has one entry); several targets add base_values only when it has one
    entry per target and write 0 for a target no leaf reached (see _v3_finish_regressor).  hitrates are
    ignored, as onnxruntime ignores them.
    """
    op_name = "TreeEnsembleRegressor"
    if n_targets is None or int(n_targets) < 1:
        raise InvalidAttributeError(f"{op_name}: n_targets must be >= 1, got {n_targets}")
    nout = int(n_targets)
    agg = _v3_enum(op_name, "aggregate_function", aggregate_function, _V3_AGG)
    post = _v3_enum(op_name, "post_transform", post_transform, _V3_POST)
    forest, _, _ = _v3_forest(
        op_name, nout, "target", nodes_treeids=nodes_treeids, nodes_nodeids=nodes_nodeids,
        nodes_featureids=nodes_featureids, nodes_modes=nodes_modes, nodes_values=nodes_values,
        nodes_values_as_tensor=nodes_values_as_tensor, nodes_truenodeids=nodes_truenodeids,
        nodes_falsenodeids=nodes_falsenodeids, nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        w_prefix="target", w_treeids=target_treeids, w_nodeids=target_nodeids, w_ids=target_ids,
        w_weights=target_weights, w_weights_as_tensor=target_weights_as_tensor, base_values=base_values,
        base_values_as_tensor=base_values_as_tensor)
    one = nout == 1
    ntrees = forest.roots.shape[0]
    nbase = forest.f64[3].shape[0]
    if nbase not in (0, nout):  # onnxruntime (TreeEnsembleAttributesV3) refuses any other length too
        raise InvalidAttributeError(f"{op_name}: base_values has {nbase} entries, expected 0 or {nout} (n_targets)")

    def run(X):
        X2 = forest.prepare(X)
        base = forest.typed(X2.dtype)[3]
        dt = X2.dtype.type
        scores, has = forest.walk(X2, agg, one, nout)
        Z = np.empty((X2.shape[0], nout), np.float32)
        full = base if nbase == nout else np.zeros(nout, X2.dtype)
        origin = dt(base[0]) if nbase == 1 else dt(0)
        _v3_finish_regressor(scores, has, agg, dt(ntrees), full, origin, one, post, Z)
        return Z
    return run


@op("TreeEnsembleClassifier", 3, domain=ML, factory=True)
@op("TreeEnsembleClassifier", 1, domain=ML, factory=True)
def TreeEnsembleClassifier(ctx, *, base_values=None, base_values_as_tensor=None, class_ids=None,
                           class_nodeids=None, class_treeids=None, class_weights=None, class_weights_as_tensor=None,
                           classlabels_int64s=None, classlabels_strings=None, nodes_falsenodeids=None,
                           nodes_featureids=None, nodes_hitrates=None, nodes_hitrates_as_tensor=None,
                           nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_nodeids=None,
                           nodes_treeids=None, nodes_truenodeids=None, nodes_values=None, nodes_values_as_tensor=None,
                           post_transform="NONE"):
    """(label [N] int64 or string, Z [N, n_classes] float32), onnxruntime's TreeEnsembleClassifier semantics.

    Scores always add up (onnxruntime's classifier aggregates with SUM).  The binary case (two labels, one
    distinct class id) and the other two-class rules are _v3_finish_classifier's; there the label is
    classlabels[1] / classlabels[0] in the binary case, but with both class ids used onnxruntime returns its
    default positive / negative labels 1 / 0, which for classlabels_int64s are the values 1 and 0 themselves
    (classlabels_strings[1] / [0] for strings).  ``weights_are_all_positive`` and the distinct class ids
    are taken over every class entry, branch entries included, as onnxruntime does.
    """
    op_name = "TreeEnsembleClassifier"
    strings = [_s(c) for c in (classlabels_strings or [])]
    ints = list(classlabels_int64s or [])
    if strings and ints:
        raise InvalidAttributeError(f"{op_name}: give classlabels_strings or classlabels_int64s, not both")
    nc = len(strings) or len(ints)
    if nc < 2:
        raise InvalidAttributeError(f"{op_name}: needs at least 2 class labels, got {nc} (with one class "
                                    f"onnxruntime writes two scores into a one-column output)")
    post = _v3_enum(op_name, "post_transform", post_transform, _V3_POST)
    forest, wid, wval = _v3_forest(
        op_name, nc, "class", nodes_treeids=nodes_treeids, nodes_nodeids=nodes_nodeids,
        nodes_featureids=nodes_featureids, nodes_modes=nodes_modes, nodes_values=nodes_values,
        nodes_values_as_tensor=nodes_values_as_tensor, nodes_truenodeids=nodes_truenodeids,
        nodes_falsenodeids=nodes_falsenodeids, nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        w_prefix="class", w_treeids=class_treeids, w_nodeids=class_nodeids, w_ids=class_ids,
        w_weights=class_weights, w_weights_as_tensor=class_weights_as_tensor, base_values=base_values,
        base_values_as_tensor=base_values_as_tensor)
    nbase = forest.f64[3].shape[0]
    if nbase not in ((0, 1, 2) if nc == 2 else (0, nc)):  # as onnxruntime (TreeEnsembleAttributesV3) refuses
        raise InvalidAttributeError(f"{op_name}: base_values has {nbase} entries, expected "
                                    f"{'0, 1 or 2' if nc == 2 else f'0 or {nc}'} for {nc} classes")
    binary_case = nc == 2 and np.unique(wid).shape[0] == 1
    all_positive = not bool((wval < 0).any())
    if strings:
        table = np.array(strings, dtype=OBJ)
    elif nc == 2 and not binary_case:
        table = np.array([0, 1], np.int64)  # onnxruntime's default negative / positive labels, not classlabels
    else:
        table = np.array(ints, np.int64)

    def run(X):
        X2 = forest.prepare(X)
        base = forest.typed(X2.dtype)[3]
        scores, has = forest.walk(X2, 1, False, nc)
        Z = np.empty((X2.shape[0], nc), np.float32)
        idx = np.empty(X2.shape[0], np.int64)
        _v3_finish_classifier(scores, has, base, post, binary_case, all_positive, Z, idx)
        if idx.size and idx.min() < 0:
            raise InvalidArgumentError(f"{op_name}: row {int(np.argmin(idx))} reached only leaves without class "
                                       f"weights and there are no base_values, so no class has a score to pick a "
                                       f"label from (onnxruntime fails on this row too)")
        return table[idx], Z
    return run


# -- small ops -----------------------------------------------------------------------------------

@op("ArrayFeatureExtractor", 1, domain=ML)
def ArrayFeatureExtractor(X, Y):
    idx = np.asarray(Y).reshape(-1).astype(np.int64)
    if X.ndim == 0:
        raise ShapeMismatchError("ArrayFeatureExtractor expects an input of rank >= 1, got a scalar")
    check_indices("ArrayFeatureExtractor", idx, 0, X.shape[-1])
    res = np.take(X, idx, axis=-1)
    return res.reshape(1, -1) if X.ndim == 1 else res


@op("Binarizer", 1, domain=ML)
def Binarizer(X, *, threshold=0.0):
    if X.dtype.kind not in "fiu":
        raise InvalidArgumentError(f"Binarizer expects a numeric input, got {X.dtype}")
    return (X > threshold).astype(X.dtype)
