"""TreeEnsembleRegressor and TreeEnsembleClassifier (ai.onnx.ml 1 and 3) against onnxruntime's CPU kernels.

Every case builds a one-node model with onnx.helper and runs it through ``runtime.InferenceSession`` and
``onnxruntime.InferenceSession`` in the same test.  Labels must match exactly; float32 scores within the
tolerance fixed below (RTOL / ATOL), NaN matching NaN.  onnxruntime leaves the second score column of some
two-class rows unwritten (PROBIT, or two classes that both have weights and a row scoring only class 0 with
base_values of length 1): those cases compare the first column only, and say so.

The trees are tiny and the whole file runs in a few seconds once Numba's cache holds the kernels.
"""
import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime
from runtime.errors import IndexOutOfRangeError, InvalidAttributeError

RTOL, ATOL = 1e-5, 1e-6  # float32 scores: onnxruntime accumulates and transforms in float32 as well
ML = "ai.onnx.ml"
ET = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
      np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32}
MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
POSTS = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"]
RNG = np.random.default_rng(0)
ort.set_default_logger_severity(3)


def _sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


def _model(op_type, x_dtype, opset=3, **attrs):
    if op_type == "TreeEnsembleRegressor":
        outs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    else:
        lt = TensorProto.STRING if "classlabels_strings" in attrs else TensorProto.INT64
        outs = [helper.make_tensor_value_info("label", lt, None),
                helper.make_tensor_value_info("probs", TensorProto.FLOAT, None)]
    node = helper.make_node(op_type, ["X"], [o.name for o in outs], domain=ML, name="trees", **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", ET[np.dtype(x_dtype)], None)], outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15), helper.make_opsetid(ML, opset)])
    m.ir_version = 8
    return m.SerializeToString()


def _run_ours(model, X):
    return runtime.InferenceSession(model).run(None, {"X": X})


def _run_ort(model, X):
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"X": X})


def _assert_same(ours, ref, first_column_only=False):
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        assert a.shape == b.shape, (a.shape, b.shape)
        if a.dtype == object or b.dtype == object or b.dtype.kind in "iu":
            assert a.dtype == b.dtype, (a.dtype, b.dtype)
            assert a.tolist() == b.tolist()
        else:
            assert a.dtype == np.float32 and b.dtype == np.float32
            if first_column_only:
                a, b = a[:, :1], b[:, :1]
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True)


def _compare(op_type, X, opset=3, ort_X=None, first_column_only=False, **attrs):
    """Run the model through both runtimes (onnxruntime on ``ort_X`` when given) and compare; return ours."""
    model = _model(op_type, X.dtype, opset, **attrs)
    ref_model = model if ort_X is None else _model(op_type, ort_X.dtype, opset, **attrs)
    ours = _run_ours(model, X)
    ref = _run_ort(ref_model, X if ort_X is None else ort_X)
    _assert_same(ours, ref, first_column_only)
    return ours


def _stump(mode="BRANCH_LEQ", value=0.5, feature=0, tree=0, missing=None):
    """Three nodes of one tree: node 0 tests X[feature] against value, node 1 (true) and 2 (false) are leaves."""
    attrs = dict(nodes_treeids=[tree] * 3, nodes_nodeids=[0, 1, 2], nodes_featureids=[feature, 0, 0],
                 nodes_modes=[mode, "LEAF", "LEAF"], nodes_values=[value, 0.0, 0.0], nodes_truenodeids=[1, 0, 0],
                 nodes_falsenodeids=[2, 0, 0])
    if missing is not None:
        attrs["nodes_missing_value_tracks_true"] = [missing, 0, 0]
    return attrs


def _concat(*trees):
    out = {}
    for t in trees:
        for k, v in t.items():
            out.setdefault(k, []).extend(v)
    return out


def _forest(ntrees=3, nfeat=3, depth=3, seed=0):
    """Random complete-ish trees with mixed modes; returns (node attrs, [(tree, leaf id)])."""
    rng = np.random.default_rng(seed)
    grid = [-1.0, -0.5, 0.0, 0.25, 0.5, 1.0]
    attrs = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes", "nodes_values",
                             "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true")}
    leaves = []
    for t in range(ntrees):
        count = [0]

        def build(d):
            i, pos = count[0], len(attrs["nodes_modes"])  # node id within the tree, position in the lists
            count[0] += 1
            row = dict(nodes_treeids=t, nodes_nodeids=i, nodes_featureids=int(rng.integers(nfeat)),
                       nodes_values=float(rng.choice(grid)), nodes_missing_value_tracks_true=int(rng.random() < .5),
                       nodes_truenodeids=0, nodes_falsenodeids=0, nodes_modes="LEAF")
            for k, v in row.items():
                attrs[k].append(v)
            if d == 0 or (d < depth and rng.random() < 0.3):
                leaves.append((t, i))
            else:
                attrs["nodes_modes"][pos] = str(rng.choice(MODES))
                attrs["nodes_truenodeids"][pos] = build(d - 1)
                attrs["nodes_falsenodeids"][pos] = build(d - 1)
            return i
        build(depth)
    return attrs, leaves


def _weights(prefix, leaves, nout, seed=0, per_leaf=(1, 2), signs="mixed"):
    rng = np.random.default_rng(seed)
    out = {f"{prefix}_treeids": [], f"{prefix}_nodeids": [], f"{prefix}_ids": [], f"{prefix}_weights": []}
    for t, n in leaves:
        for _ in range(int(rng.integers(per_leaf[0], per_leaf[1] + 1))):
            w = round(float(rng.uniform(0.05, 1.0)), 3)
            out[f"{prefix}_treeids"].append(t)
            out[f"{prefix}_nodeids"].append(n)
            out[f"{prefix}_ids"].append(int(rng.integers(nout)))
            out[f"{prefix}_weights"].append(-w if signs == "mixed" and rng.random() < 0.5 else w)
    return out


def _grid_X(n=64, nfeat=3, dtype=np.float32, nan=True):
    X = RNG.choice([-1.0, -0.5, 0.0, 0.25, 0.3, 0.5, 1.0, 2.0], size=(n, nfeat))
    if nan:
        X[RNG.random((n, nfeat)) < 0.15] = np.nan
    return X.astype(dtype)


# -- regressor -------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_every_branch_mode_with_missing_values_both_ways(mode):
    # tree 0 sends NaN to the true branch, tree 1 does not (the comparison decides, so NEQ still goes true)
    attrs = _concat(_stump(mode, 0.5, tree=0, missing=1), _stump(mode, 0.5, tree=1, missing=0))
    X = np.array([[0.4], [0.5], [0.6], [np.nan], [-np.inf], [np.inf]], np.float32)
    (Y,) = _compare("TreeEnsembleRegressor", X, n_targets=2, target_treeids=[0, 0, 1, 1],
                    target_nodeids=[1, 2, 1, 2], target_ids=[0, 0, 1, 1], target_weights=[1.0, 2.0, 10.0, 20.0],
                    **attrs)
    assert Y[3].tolist() == [1.0, 10.0 if mode == "BRANCH_NEQ" else 20.0]


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("n_targets", [1, 3])
def test_regressor_aggregates_with_base_values_and_multi_target_leaves(agg, n_targets):
    nodes, leaves = _forest(ntrees=4, seed=1)
    w = _weights("target", leaves, n_targets, seed=2, per_leaf=(1, 3))  # leaves carry up to three entries
    X = _grid_X()
    base = [0.25, -0.5, 1.0][:n_targets]
    (Y,) = _compare("TreeEnsembleRegressor", X, n_targets=n_targets, aggregate_function=agg, base_values=base,
                    **nodes, **w)
    assert Y.shape == (64, n_targets) and Y.dtype == np.float32


def test_regressor_leaf_with_several_targets():
    # the true leaf carries entries for targets 0, 2 and 0 again; the false leaf only target 1 (so targets 0
    # and 2 are unreached there and come out as 0 even with base_values, as in onnxruntime)
    X = np.array([[0.0], [1.0]], np.float32)
    (Y,) = _compare("TreeEnsembleRegressor", X, n_targets=3, target_treeids=[0, 0, 0, 0], target_nodeids=[1, 1, 2, 1],
                    target_ids=[0, 2, 1, 0], target_weights=[0.5, 2.0, 3.0, 0.25], base_values=[1.0, 1.0, 1.0],
                    **_stump())
    np.testing.assert_allclose(Y, [[1.75, 0.0, 3.0], [0.0, 4.0, 0.0]])


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("n_targets", [1, 3])
def test_regressor_post_transforms(post, n_targets):
    # with one target onnxruntime applies only PROBIT (LOGISTIC and the softmaxes leave the score raw)
    nodes, leaves = _forest(ntrees=3, seed=3)
    w = _weights("target", leaves, n_targets, seed=4)
    if post == "PROBIT":  # probit needs scores in (0, 1)
        w["target_weights"] = [abs(v) / 4 for v in w["target_weights"]]
    _compare("TreeEnsembleRegressor", _grid_X(), n_targets=n_targets, post_transform=post,
             aggregate_function="AVERAGE", **nodes, **w)


def test_regressor_single_target_uses_first_leaf_weight_only():
    """onnxruntime's single-output path reads one weight per leaf (the first entry in attribute order)."""
    X = np.array([[0.0], [1.0]], np.float32)
    (Y,) = _compare("TreeEnsembleRegressor", X, n_targets=1, target_treeids=[0, 0, 0], target_nodeids=[1, 2, 1],
                    target_ids=[0, 0, 0], target_weights=[0.5, 2.0, 100.0], base_values=[0.25], **_stump())
    np.testing.assert_allclose(Y, [[0.75], [2.25]])


# -- classifier ------------------------------------------------------------------------------------

@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("labels", ["int64", "string"])
def test_multiclass_classifier(post, labels):
    nodes, leaves = _forest(ntrees=3, seed=5)
    w = _weights("class", leaves, 4, seed=6, per_leaf=(1, 3))
    lab = ({"classlabels_int64s": [3, 10, 7, 42]} if labels == "int64"
           else {"classlabels_strings": ["ant", "bee", "cat", "dog"]})
    label, Z = _compare("TreeEnsembleClassifier", _grid_X(), post_transform=post,
                        base_values=[0.1, -0.2, 0.3, 0.0], **nodes, **w, **lab)
    assert Z.shape == (64, 4)
    assert label.dtype == (np.int64 if labels == "int64" else object)


@pytest.mark.parametrize("signs", ["positive", "mixed"])
@pytest.mark.parametrize("nbase", [0, 1, 2])
@pytest.mark.parametrize("class_id", [0, 1])
@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_binary_classifier_one_weight_column(signs, nbase, class_id, post):
    """Two labels, one class id: onnxruntime's binary case (threshold 0.5 or 0, second column derived)."""
    nodes, leaves = _forest(ntrees=3, seed=7)
    w = _weights("class", leaves, 1, seed=8, signs="positive" if signs == "positive" else "mixed")
    w["class_ids"] = [class_id] * len(w["class_ids"])
    if signs == "positive":
        w["class_weights"] = [v / 2 for v in w["class_weights"]]  # sums straddle the 0.5 threshold
    base = {"base_values": [-0.2, 0.3][:nbase]} if nbase else {}
    label, Z = _compare("TreeEnsembleClassifier", _grid_X(), post_transform=post, classlabels_int64s=[4, 9],
                        **nodes, **w, **base)
    assert set(label.tolist()) <= {4, 9}


@pytest.mark.parametrize("nbase", [0, 2])
def test_two_classes_both_used_label_quirk(nbase):
    """Two labels with both class ids used: onnxruntime labels rows 1 / 0 (its default positive / negative
    labels), not classlabels_int64s."""
    nodes, leaves = _forest(ntrees=2, seed=9)
    w = _weights("class", leaves, 2, seed=10)
    base = {"base_values": [0.1, -0.1]} if nbase else {}
    label, _ = _compare("TreeEnsembleClassifier", _grid_X(), classlabels_int64s=[5, 7], post_transform="LOGISTIC",
                        **nodes, **w, **base)
    assert set(label.tolist()) <= {0, 1}


def test_binary_probit_first_column():
    """PROBIT on a one-score binary row: onnxruntime writes column 0 only (column 1 is left unwritten)."""
    X = np.array([[0.1], [0.9], [np.nan]], np.float32)
    _, Z = _compare("TreeEnsembleClassifier", X, first_column_only=True, class_treeids=[0, 0], class_nodeids=[1, 2],
                    class_ids=[0, 0], class_weights=[0.2, 0.8], classlabels_int64s=[0, 1], post_transform="PROBIT",
                    base_values=[0.05], **_stump("BRANCH_LT"))
    assert Z[:, 1].tolist() == [0.0, 0.0, 0.0]


def test_binary_logistic_stump_case():
    """The reported case: mixed-sign weights, base -0.405, LOGISTIC -> probs[0][1] = sigmoid(0.3 - 0.405)."""
    X = np.array([[0.1, 0.0, 0.0]], np.float32)
    attrs = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
                 nodes_modes=["BRANCH_LT", "LEAF", "LEAF"], nodes_values=[0.5, 0, 0], nodes_truenodeids=[1, 0, 0],
                 nodes_falsenodeids=[2, 0, 0], class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[0, 0],
                 class_weights=[0.3, -0.3], classlabels_int64s=[0, 1], base_values=[-0.405],
                 post_transform="LOGISTIC")
    label, Z = _compare("TreeEnsembleClassifier", X, **attrs)
    assert abs(float(Z[0, 1]) - _sigmoid(-0.105)) < 1e-6
    assert label.tolist() == [0]


@pytest.mark.parametrize("weight,base", [(0.0, -0.405), (-0.405, 0.0)])
def test_leaf_only_tree_logistic(weight, base):
    """A tree that is a single leaf: probs[0][1] = sigmoid(weight + base) = sigmoid(-0.405) either way."""
    X = np.array([[0.1, 0.0, 0.0]], np.float32)
    attrs = dict(nodes_treeids=[0], nodes_nodeids=[0], nodes_featureids=[0], nodes_modes=["LEAF"],
                 nodes_values=[0.0], nodes_truenodeids=[0], nodes_falsenodeids=[0], class_treeids=[0],
                 class_nodeids=[0], class_ids=[0], class_weights=[weight], classlabels_int64s=[0, 1],
                 base_values=[base], post_transform="LOGISTIC")
    label, Z = _compare("TreeEnsembleClassifier", X, **attrs)
    assert abs(float(Z[0, 1]) - _sigmoid(-0.405)) < 1e-6
    assert abs(float(Z[0, 0]) - (1 - _sigmoid(-0.405))) < 1e-6
    assert label.tolist() == [0]


# -- version 3 tensors, input types ----------------------------------------------------------------

def _as_tensors(attrs, prefix, dtype):
    out = dict(attrs)
    for name in ("nodes_values", f"{prefix}_weights", "base_values"):
        if name in out:
            out[f"{name}_as_tensor"] = numpy_helper.from_array(np.array(out.pop(name), dtype))
    out["nodes_hitrates_as_tensor"] = numpy_helper.from_array(np.ones(len(out["nodes_modes"]), dtype))
    return out


def test_v3_double_tensors_regressor():
    # 0.1 as a double threshold: a float threshold would round it and flip the equality rows
    nodes = _concat(_stump("BRANCH_LEQ", 0.1, tree=0), _stump("BRANCH_EQ", 0.1, tree=1))
    attrs = dict(nodes, n_targets=2, target_treeids=[0, 0, 1, 1], target_nodeids=[1, 2, 1, 2],
                 target_ids=[0, 0, 1, 1], target_weights=[0.1, 1e-9, 0.3, 0.7], base_values=[1e-9, 0.5])
    X = np.array([[0.1], [np.nextafter(0.1, 1)], [0.0999999]], np.float64)
    (Y,) = _compare("TreeEnsembleRegressor", X, **_as_tensors(attrs, "target", np.float64))
    assert Y.dtype == np.float32
    np.testing.assert_allclose(Y[:2], [[0.1 + 1e-9, 0.3 + 0.5], [1e-9 + 1e-9, 0.7 + 0.5]], rtol=1e-6)


def test_v3_double_tensors_classifier():
    nodes, leaves = _forest(ntrees=3, seed=11)
    w = _weights("class", leaves, 3, seed=12)
    attrs = _as_tensors(dict(nodes, **w, base_values=[0.1, 0.2, 0.3]), "class", np.float64)
    _compare("TreeEnsembleClassifier", _grid_X(dtype=np.float64), classlabels_strings=["a", "b", "c"],
             post_transform="SOFTMAX", **attrs)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_integer_input(dtype):
    nodes, leaves = _forest(ntrees=3, seed=13)
    nodes["nodes_values"] = [v * 4 + 0.5 for v in nodes["nodes_values"]]
    X = RNG.integers(-6, 7, size=(64, 3)).astype(dtype)
    X[0, 0] = 16777217  # compared as float (rounds to 2**24), as onnxruntime compares an int with a float
    w = _weights("class", leaves, 3, seed=14)
    _compare("TreeEnsembleClassifier", X, classlabels_int64s=[0, 1, 2], **nodes, **w)
    # onnxruntime has no integer TreeEnsembleRegressor kernel: its float path on the same values is the reference
    wr = _weights("target", leaves, 2, seed=15)
    _compare("TreeEnsembleRegressor", X, ort_X=X.astype(np.float32), n_targets=2, **nodes, **wr)


def test_one_dimensional_input_is_one_row():
    X = np.array([0.1, 0.9], np.float32)
    (Y,) = _compare("TreeEnsembleRegressor", X, opset=1, n_targets=1, target_treeids=[0, 0], target_nodeids=[1, 2],
                    target_ids=[0, 0], target_weights=[1.0, 2.0], **_stump())
    assert Y.tolist() == [[1.0]]


@pytest.mark.parametrize("seed", range(6))
def test_random_forests_against_ort(seed):
    rng = np.random.default_rng(100 + seed)
    nodes, leaves = _forest(ntrees=int(rng.integers(1, 6)), depth=4, seed=200 + seed)
    X = _grid_X(n=80)  # more than 50 rows: onnxruntime takes its parallel paths
    w = _weights("target", leaves, 2, seed=300 + seed, per_leaf=(0, 2))  # some leaves without weights
    _compare("TreeEnsembleRegressor", X, n_targets=2, aggregate_function=str(rng.choice(["SUM", "MIN", "MAX"])),
             base_values=[0.5, -0.5], post_transform=str(rng.choice(POSTS[:4])), **nodes, **w)
    w = _weights("class", leaves, 3, seed=400 + seed, per_leaf=(1, 2))
    _compare("TreeEnsembleClassifier", X, classlabels_int64s=[7, 8, 9], post_transform=str(rng.choice(POSTS)),
             **nodes, **w)


# -- refusals --------------------------------------------------------------------------------------

def _clf_attrs(**over):
    attrs = dict(_stump(), class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[0, 1], class_weights=[1.0, 2.0],
                 classlabels_int64s=[0, 1])
    attrs.update(over)
    return attrs


@pytest.mark.parametrize("over,match", [
    (dict(nodes_truenodeids=[7, 0, 0]), r"node 7 of tree 0 does not exist, but node 0 of tree 0 names it as its "
                                        r"true branch"),
    (dict(class_nodeids=[1, 5]), r"class entry 1 names node 5 of tree 0, which does not exist"),
    (dict(nodes_nodeids=[0, 1, 1]), r"node 1 of tree 0 is defined twice"),
    (dict(nodes_modes=["BRANCH_LEQ", "BRANCH_LEQ", "LEAF"], nodes_truenodeids=[1, 0, 0]),
     r"node 1 of tree 0 branches back to node 0 of tree 0"),
    (dict(nodes_modes=["BRANCH_XX", "LEAF", "LEAF"]), r"unknown node mode"),
])
def test_bad_model_is_refused_at_load(over, match):
    model = _model("TreeEnsembleClassifier", np.float32, **_clf_attrs(**over))
    with pytest.raises(InvalidAttributeError, match="'trees'.*" + match):
        runtime.InferenceSession(model)


def test_bad_ids_and_features_are_refused():
    with pytest.raises(IndexOutOfRangeError, match="class id 2 is out of bounds"):
        runtime.InferenceSession(_model("TreeEnsembleClassifier", np.float32, **_clf_attrs(class_ids=[0, 2])))
    sess = runtime.InferenceSession(_model("TreeEnsembleClassifier", np.float32,
                                           **_clf_attrs(nodes_featureids=[3, 0, 0])))
    with pytest.raises(IndexOutOfRangeError, match="feature id 3 is out of bounds for 2 features"):
        sess.run(None, {"X": np.zeros((4, 2), np.float32)})
