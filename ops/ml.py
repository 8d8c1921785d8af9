"""Classic-ML ops of the ``ai.onnx.ml`` domain: LabelEncoder, TreeEnsemble, ArrayFeatureExtractor, Binarizer.

LabelEncoder maps through a dictionary built at plan time (keys and values
may be strings, so it stays in Python; float keys match NaN to NaN).
TreeEnsemble flattens the trees into typed arrays once at plan time and
walks them in one float64 kernel that compiles a single specialization;
BRANCH_MEMBER sets are taken from ``membership_values`` in node order.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import check_indices
from .registry import op

__all__ = ["LabelEncoder", "TreeEnsemble", "ArrayFeatureExtractor", "Binarizer"]
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


def _erfinv(x):
    # Giles' single-precision approximation, as onnxruntime's PROBIT uses.
    w = -np.log((1.0 - x) * (1.0 + x))
    small = w < 5.0
    ws = w - 2.5
    p1 = 2.81022636e-08
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503, -0.00417768164,
              0.246640727, 1.50140941):
        p1 = c + p1 * ws
    wl = np.sqrt(np.maximum(w, 5.0)) - 3.0
    p2 = -0.000200214257
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613, 0.00943887047,
              1.00167406, 2.83297682):
        p2 = c + p2 * wl
    return np.where(small, p1, p2) * x


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
        return math.sqrt(2.0) * _erfinv(2.0 * y - 1.0)
    raise InvalidAttributeError(f"TreeEnsemble: post_transform must be 0..4, got {post_transform}")


def _no_cycle(roots, tnode, fnode, tleaf, fleaf) -> None:
    """Refuse branch links that lead back to a node on the way (the walk would never reach a leaf)."""
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
                raise InvalidAttributeError(f"TreeEnsemble: node {node} branches back to node {int(nxt)}, which is on "
                                            f"its own path from root {root}: the trees must not have cycles")
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
