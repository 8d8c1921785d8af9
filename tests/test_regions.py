"""Compiled regions (runtime/regions.py, ops/compiled_forms.py): a run of nodes generated into one function
gives the per-node plan's results, declines what it cannot express, and names the node in its errors."""
import numpy as np

import pytest
from numba import njit
from onnx import TensorProto, helper, numpy_helper

from runtime import InferenceSession, SessionOptions
from runtime.errors import IndexOutOfRangeError, InvalidArgumentError

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT
I64 = TensorProto.INT64
MS = "com.microsoft"


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 9
    return m.SerializeToString()


def _sessions(model):
    on = SessionOptions()
    on.compiled_regions = True
    return InferenceSession(model, on), InferenceSession(model)


def _covered(sess):
    return sum(len(r.nodes) for r in sess.plan.regions)


def _check(model, feeds, n_nodes, exact=True):
    fused, plain = _sessions(model)
    assert _covered(fused) == n_nodes, [(n.op_type) for n in fused.plan.graph.nodes]
    for a, b in zip(fused.run(None, feeds), plain.run(None, feeds)):
        assert a.shape == b.shape and a.dtype == b.dtype
        if exact:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return fused


def _vi(name, et, shape):
    return helper.make_tensor_value_info(name, et, shape)


def test_mask_subgraph_and_embedding():
    """The attention-mask arithmetic and the embedding gather every builder decoder starts with."""
    emb = RNG.standard_normal((50, 8)).astype(np.float32)
    nodes = [
        helper.make_node("ReduceSum", ["mask", "one_ax"], ["s"], keepdims=0),
        helper.make_node("Sub", ["s", "one"], ["s1"]),
        helper.make_node("Cast", ["s1"], ["seqlens"], to=TensorProto.INT32),
        helper.make_node("Shape", ["mask"], ["shp"]),
        helper.make_node("Gather", ["shp", "one"], ["tot64"], axis=0),
        helper.make_node("Cast", ["tot64"], ["tot"], to=TensorProto.INT32),
        helper.make_node("Gather", ["emb", "ids"], ["x"], axis=0),
        helper.make_node("Sigmoid", ["x"], ["sx"]),
        helper.make_node("Mul", ["x", "sx"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "one_ax"),
             numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(emb, "emb")]
    model = _model(nodes, [_vi("mask", I64, ["b", "t"]), _vi("ids", I64, ["b", "s"])],
                   [_vi("seqlens", TensorProto.INT32, None), _vi("tot", TensorProto.INT32, None), _vi("y", F, None)],
                   inits)
    feeds = {"mask": np.ones((2, 7), np.int64), "ids": RNG.integers(-50, 50, (2, 3)).astype(np.int64)}
    fused = _check(model, feeds, len(nodes))
    out = fused.run(None, feeds)
    assert out[0].tolist() == [6, 6] and int(out[1]) == 7


def test_gather_index_out_of_range_names_the_node():
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["x"], axis=0, name="embed"),
             helper.make_node("Relu", ["x"], ["y"])]
    model = _model(nodes, [_vi("ids", I64, ["s"])], [_vi("y", F, None)],
                   [numpy_helper.from_array(np.ones((5, 3), np.float32), "emb")])
    fused, _ = _sessions(model)
    assert _covered(fused) == 2
    with pytest.raises(IndexOutOfRangeError) as err:
        fused.run(None, {"ids": np.array([1, 5], np.int64)})
    # the node once, the index and the extent (a vocabulary size, for an embedding)
    assert str(err.value) == ("node 'embed' (Gather, domain 'ai.onnx', opset 17): index 5 is out of range for axis 0 "
                              "of extent 5 (valid indices are -extent to extent - 1)")


def test_a_split_that_does_not_fit_raises_as_the_wrapper_does():
    """The Split form's run-time checks raise the wrapper's error class, naming the node."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Split", ["r", "sizes"], ["a", "b"], axis=1, name="cut"),
             helper.make_node("Split", ["r"], ["c", "d"], axis=1, name="halves")]
    model = _model(nodes, [_vi("x", F, [2, "n"])], [_vi(o, F, None) for o in "abcd"],
                   [numpy_helper.from_array(np.array([1, 2], np.int64), "sizes")])
    fused, plain = _sessions(model)
    assert _covered(fused) == 3
    for sess in (fused, plain):
        with pytest.raises(InvalidArgumentError, match="'cut'.*must be 2 non-negative sizes summing to"):
            sess.run(None, {"x": np.ones((2, 4), np.float32)})
        with pytest.raises(InvalidArgumentError, match="'halves'.*cannot be split into 2 equal parts"):
            sess.run(None, {"x": np.ones((2, 3), np.float32)})


def test_shapes_reshape_transpose_split_matmul():
    w = RNG.standard_normal((12, 6)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Reshape", ["h", "shape"], ["h4"]),
        helper.make_node("Transpose", ["h4"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Split", ["t", "sizes"], ["a", "b"], axis=-1),
        helper.make_node("Split", ["h"], ["c", "d"], axis=2),
        helper.make_node("Tanh", ["a"], ["ta"]),
        helper.make_node("Div", ["b", "c4"], ["bd"]),
        helper.make_node("Add", ["c", "d"], ["cd"]),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([0, 0, 2, -1], np.int64), "shape"),
             numpy_helper.from_array(np.array([1, 2], np.int64), "sizes"),
             numpy_helper.from_array(np.array(4.0, np.float32), "c4")]
    model = _model(nodes, [_vi("x", F, ["b", "s", 12])],
                   [_vi("ta", F, None), _vi("bd", F, None), _vi("cd", F, None)], inits)
    _check(model, {"x": RNG.standard_normal((2, 5, 12)).astype(np.float32)}, len(nodes), exact=False)


def test_norms_and_gelu():
    n = 16
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y"], epsilon=1e-6, axis=-1),
        helper.make_node("SkipSimplifiedLayerNormalization", ["y", "r", "g"], ["z", "", "", "sum"], domain=MS,
                         epsilon=1e-6),
        helper.make_node("Gelu", ["z"], ["gz"], domain=MS),
        helper.make_node("Gelu", ["sum"], ["gs"], approximate="tanh"),
        helper.make_node("ReduceSum", ["gs", "ax"], ["rs"], keepdims=1),  # float64 accumulation, as the wrapper
    ]
    inits = [numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32), "g"),
             numpy_helper.from_array(np.array([1], np.int64), "ax")]
    model = _model(nodes, [_vi("x", F, ["b", "s", n]), _vi("r", F, ["b", "s", n])],
                   [_vi("gz", F, None), _vi("gs", F, None), _vi("sum", F, None), _vi("rs", F, None)], inits,
                   opset=20)
    feeds = {"x": RNG.standard_normal((2, 3, n)).astype(np.float32),
             "r": RNG.standard_normal((2, 3, n)).astype(np.float32)}
    _check(model, feeds, len(nodes))


def _gqa_model(H, kvH, D, past_dim, extra=(), extra_outputs=(), **attrs):
    """The builder's attention block: seqlens_k and total length from the mask, then GroupQueryAttention on packed
    QKV with past buffers of ``past_dim`` rows (a symbol, or a fixed capacity); ``extra`` nodes are appended."""
    nodes = [
        helper.make_node("ReduceSum", ["mask", "one_ax"], ["s"], keepdims=0),
        helper.make_node("Sub", ["s", "one"], ["s1"]),
        helper.make_node("Cast", ["s1"], ["seqlens"], to=TensorProto.INT32),
        helper.make_node("Shape", ["mask"], ["shp"]),
        helper.make_node("Gather", ["shp", "one"], ["tot64"], axis=0),
        helper.make_node("Cast", ["tot64"], ["tot"], to=TensorProto.INT32),
        helper.make_node("GroupQueryAttention", ["qkv", "", "", "pk", "pv", "seqlens", "tot", "cos", "sin"],
                         ["o", "k", "v"], domain=MS, num_heads=H, kv_num_heads=kvH, **attrs),
    ] + list(extra)
    inits = [numpy_helper.from_array(np.array([1], np.int64), "one_ax"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(RNG.standard_normal((64, D // 2)).astype(np.float32), "cos"),
             numpy_helper.from_array(RNG.standard_normal((64, D // 2)).astype(np.float32), "sin")]
    model = _model(nodes, [_vi("qkv", F, ["b", "s", (H + 2 * kvH) * D]), _vi("mask", I64, ["b", "t"]),
                           _vi("pk", F, ["b", kvH, past_dim, D]), _vi("pv", F, ["b", kvH, past_dim, D])],
                   [_vi("o", F, None), _vi("k", F, None), _vi("v", F, None)] + list(extra_outputs), inits)
    return model, len(nodes)


def _gqa_feeds(H, kvH, D, S, total, rows):
    return {"qkv": RNG.standard_normal((1, S, (H + 2 * kvH) * D)).astype(np.float32),
            "mask": np.ones((1, total), np.int64),
            "pk": RNG.standard_normal((1, kvH, rows, D)).astype(np.float32),
            "pv": RNG.standard_normal((1, kvH, rows, D)).astype(np.float32)}


@pytest.mark.parametrize("S,past,rotary,softcap,window,heads", [
    (5, 0, 1, 0.0, -1, (4, 2)), (1, 9, 1, 0.0, -1, (4, 2)), (3, 4, 0, 30.0, -1, (4, 4)),
    (1, 12, 1, 0.0, 4, (8, 1)), (4, 0, 0, 0.0, 3, (2, 2))])
def test_group_query_attention(S, past, rotary, softcap, window, heads):
    H, kvH = heads
    D = 8
    model, n = _gqa_model(H, kvH, D, "p", do_rotary=rotary, softcap=softcap, local_window_size=window)
    _check(model, _gqa_feeds(H, kvH, D, S, S + past, past), n, exact=False)


@pytest.mark.parametrize("S,past", [(6, 0), (3, 5), (1, 7)])
def test_group_query_attention_with_a_static_head_of_whole_panels(S, past):
    """A query width known at plan time whose head size is whole panels: on a host with AVX-512 the region calls
    ``gqa_f32_blocked``, which compiles no per-row prefill kernel, with the per-node plan's results."""
    from ops import group_query_attention as gq
    H, kvH, D = 4, 2, 16
    model, n = _gqa_model(H, kvH, D, "p", do_rotary=1)
    fused = _check(model, _gqa_feeds(H, kvH, D, S, S + past, past), n, exact=False)
    src = "".join(r.source for r in fused.plan.regions)
    assert gq.blocked_prefill(D) == gq.AVX512 and not gq.blocked_prefill(8) and not gq.blocked_prefill(None)
    assert ("gqa_f32_blocked" in src) == gq.blocked_prefill(D)


def test_the_blocked_twin_refuses_a_head_it_was_not_planned_for():
    """A head size the blocked prefill cannot take (8 floats) is refused with code 14 before any cache is written."""
    from ops import group_query_attention as gq
    B, S, H, kvH, D, P = 1, 3, 2, 1, 8, 6
    qkv = RNG.standard_normal((B, S, (H + 2 * kvH) * D)).astype(np.float32)
    pk, pv = np.zeros((B, kvH, P, D), np.float32), np.zeros((B, kvH, P, D), np.float32)
    z4, z1, zc = np.zeros((1, 1, 1, 1), np.float32), np.zeros(1, np.float32), np.zeros((1, 1), np.float32)
    err = gq.gqa_f32_blocked(qkv, qkv, qkv, True, pk, pv, True, np.array([S - 1], np.int64), S, zc, zc,
                             np.zeros((1, 1), np.int64), False, z4, False, z1, False, H, kvH, 0.0, 0.0, -1, False,
                             False, False, True, False, True, 0, z4, z4, 1 << 20, 1)[0]
    assert err == 14 and not pk.any() and not pv.any()
    assert "head size" in gq.GQA_ERRORS[14][1]


def test_a_node_without_a_form_splits_the_region():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("TopK", ["b", "k"], ["v", "i"], axis=-1),
             helper.make_node("Exp", ["v"], ["c"]), helper.make_node("Abs", ["c"], ["d"])]
    model = _model(nodes, [_vi("x", F, [3, 6])], [_vi("d", F, None), _vi("i", I64, None)],
                   [numpy_helper.from_array(np.array([2], np.int64), "k")])
    fused = _check(model, {"x": RNG.standard_normal((3, 6)).astype(np.float32)}, 4)
    assert len(fused.plan.regions) == 2


def test_float16_values_stay_out_of_regions():
    """Numba types no float16 array: a run of view ops on float16 values (as a float16 export's q/k norm reshapes
    make) runs node by node; the float32 run after its Cast is still a region."""
    shapes = [numpy_helper.from_array(np.array(s, np.int64), n) for n, s in (("s1", [0, -1, 4]), ("s2", [-1, 8]))]
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["a"]), helper.make_node("Reshape", ["a", "s2"], ["b"]),
             helper.make_node("Reshape", ["b", "s1"], ["c"]), helper.make_node("Cast", ["c"], ["d"], to=F),
             helper.make_node("Relu", ["d"], ["e"]), helper.make_node("Neg", ["e"], ["f"]),
             helper.make_node("Exp", ["f"], ["y"])]
    model = _model(nodes, [_vi("x", TensorProto.FLOAT16, [3, 8])], [_vi("y", F, None)], shapes)
    _check(model, {"x": RNG.standard_normal((3, 8)).astype(np.float16)}, 3)


def test_blocks_that_differ_only_in_a_constant_share_one_source():
    """A scale and shift by constant scalars (an image model repeats the pair with other values) reads its
    constants as arguments: both pairs, cut apart by a node without a form, are one kind."""
    nodes = [helper.make_node("Mul", ["x", "s0"], ["a"]), helper.make_node("Add", ["a", "t0"], ["b"]),
             helper.make_node("TopK", ["b", "k"], ["v", "i"], axis=-1),
             helper.make_node("Mul", ["v", "s1"], ["c"]), helper.make_node("Add", ["c", "t1"], ["d"])]
    inits = [numpy_helper.from_array(np.array([2], np.int64), "k")]
    inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
              (("s0", 0.75), ("t0", -1.5), ("s1", 3.0), ("t1", 0.125))]
    model = _model(nodes, [_vi("x", F, [3, 6])], [_vi("d", F, None), _vi("i", I64, None)], inits)
    fused = _check(model, {"x": RNG.standard_normal((3, 6)).astype(np.float32)}, 4)
    assert len(fused.plan.regions) == 2 and len({r.module_name for r in fused.plan.regions}) == 1


def test_a_default_plan_starts_without_regions_and_source_is_reused():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"])]
    model = _model(nodes, [_vi("x", F, [4])], [_vi("b", F, None)])
    assert not InferenceSession(model).plan.regions
    a, _ = _sessions(model)
    b, _ = _sessions(model)
    assert a.plan.regions[0].module_name == b.plan.regions[0].module_name
    assert a.plan.regions[0].fn is b.plan.regions[0].fn


def test_native_decoder_runs_one_region_per_step():
    """The pipeline's native decoder runs the whole llama decoder step as compiled regions: the embedding, one
    call per layer (both layers one kind, the last layer's norm exposing its residual sum as the first's does),
    and the head."""
    import os
    from pipeline.backends import BackendChoice
    from pipeline.metadata import load_package
    from pipeline.runner import Pipeline
    pkg = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "packages",
                       "llama_fp32")
    spec = load_package(pkg)
    pipe = Pipeline(spec, BackendChoice(set(), True, "cpu"))
    plan = pipe.decoder.session.plan
    assert len(plan.regions) == len(plan.steps) == 4
    assert len({r.module_name for r in plan.regions}) == 3
    assert _covered(pipe.decoder.session) == len(plan.graph.nodes)



@pytest.mark.parametrize("S,total", [(3, 3), (1, 11), (2, 14)])
def test_group_query_attention_sliding_window_cache(S, total):
    """gemma3's windowed layers: a fixed-capacity cache holding the last L(T) positions."""
    H, kvH, D, C, W = 4, 2, 8, 8, 4
    model, n = _gqa_model(H, kvH, D, C, do_rotary=1, local_window_size=W, sliding_window_cache=1)
    _check(model, _gqa_feeds(H, kvH, D, S, total, C), n, exact=False)


@pytest.mark.parametrize("S,live,rotary", [(1, 9, 1), (3, 4, 0), (5, 0, 1)])
def test_shared_kv_buffers_are_written_in_place(S, live, rotary):
    """``kv_share_buffer``: past buffers with room for the total sequence are donated, so GroupQueryAttention writes
    the new rows into them and returns them as present; attention and the live rows equal the copying path's, fed
    only the live rows."""
    H, kvH, D, cap = 4, 2, 8, 16
    model, n = _gqa_model(H, kvH, D, "p", do_rotary=rotary)
    opts = SessionOptions()
    opts.compiled_regions = True
    opts.kv_share_buffer = True
    shared = InferenceSession(model, opts)
    assert _covered(shared) == n
    plain = InferenceSession(model)
    feeds = _gqa_feeds(H, kvH, D, S, S + live, cap)
    pk, pv = feeds["pk"].copy(), feeds["pv"].copy()
    ref = plain.run(None, dict(feeds, pk=pk[:, :, :live].copy(), pv=pv[:, :, :live].copy()))
    o, k, v = shared.run(None, feeds)
    assert k.__array_interface__["data"][0] == feeds["pk"].__array_interface__["data"][0] and k.shape == pk.shape
    assert v.__array_interface__["data"][0] == feeds["pv"].__array_interface__["data"][0]
    np.testing.assert_array_equal(o, ref[0])
    np.testing.assert_array_equal(k[:, :, :S + live], ref[1])
    np.testing.assert_array_equal(v[:, :, :S + live], ref[2])
    np.testing.assert_array_equal(k[:, :, S + live:], pk[:, :, S + live:])  # rows past the live ones: untouched
    # No room for the total: the past is copied as usual, the caller's buffer is left alone.
    small = _gqa_feeds(H, kvH, D, S, S + live, live)
    before = small["pk"].copy()
    o2, k2, _ = shared.run(None, small)
    np.testing.assert_array_equal(small["pk"], before)
    np.testing.assert_array_equal(o2, plain.run(None, small)[0])


def test_a_past_read_by_another_node_is_not_donated():
    """Only graph inputs read by a single node may be overwritten: here the past also feeds a Shape."""
    H, kvH, D = 4, 2, 8
    model, _ = _gqa_model(H, kvH, D, "p", extra=[helper.make_node("Shape", ["pk"], ["pk_shape"])],
                          extra_outputs=[_vi("pk_shape", I64, None)])
    opts = SessionOptions()
    opts.compiled_regions = True
    opts.kv_share_buffer = True
    feeds = _gqa_feeds(H, kvH, D, 1, 6, 16)
    before = feeds["pk"].copy()
    _, k, _, _ = InferenceSession(model, opts).run(None, feeds)
    np.testing.assert_array_equal(feeds["pk"], before)
    assert k.__array_interface__["data"][0] != feeds["pk"].__array_interface__["data"][0]


# -- repeated structure: one generated function per layer kind --------------------------------------

def _stack(n_layers, eps=lambda l: 1e-6, width=8, out=5):
    """A decoder-like stack: per layer RMS norm, MatMul, SiLU, MatMul and the residual Add (6 nodes, each layer
    with its own weights), then a head MatMul; the layers differ only in their weights and ``eps``."""
    r = np.random.default_rng(1)
    nodes, inits, x = [], [], "x"
    for l in range(n_layers):
        nodes += [helper.make_node("SimplifiedLayerNormalization", [x, f"g{l}"], [f"n{l}"], epsilon=eps(l), axis=-1),
                  helper.make_node("MatMul", [f"n{l}", f"w{l}"], [f"h{l}"]),
                  helper.make_node("Sigmoid", [f"h{l}"], [f"s{l}"]),
                  helper.make_node("Mul", [f"h{l}", f"s{l}"], [f"a{l}"]),
                  helper.make_node("MatMul", [f"a{l}", f"u{l}"], [f"d{l}"]),
                  helper.make_node("Add", [x, f"d{l}"], [f"x{l}"])]
        inits += [numpy_helper.from_array(r.standard_normal(width).astype(np.float32), f"g{l}"),
                  numpy_helper.from_array(r.standard_normal((width, 2 * width)).astype(np.float32), f"w{l}"),
                  numpy_helper.from_array(r.standard_normal((2 * width, width)).astype(np.float32) * 0.1, f"u{l}")]
        x = f"x{l}"
    nodes.append(helper.make_node("MatMul", [x, "head"], ["y"]))
    inits.append(numpy_helper.from_array(r.standard_normal((width, out)).astype(np.float32), "head"))
    return _model(nodes, [_vi("x", F, ["b", "s", width])], [_vi("y", F, None)], inits, opset=20)


def _kinds(sess):
    return {r.module_name for r in sess.plan.regions}


def test_layer_pieces_cut_a_stack_at_its_period_whatever_the_depth():
    from runtime.regions import layer_pieces
    head, layer, tail = [90, 91], [1, 2, 3, 4, 5, 6, 7], [80]
    for depth in (2, 5, 30):
        sigs = head + layer * depth + tail
        pieces = layer_pieces(sigs, max_nodes=48)
        assert pieces[0] == (0, 2) and pieces[-1] == (len(sigs) - 1, len(sigs))
        assert [b - a for a, b in pieces[1:-1]] == [7] * depth
        assert {tuple(sigs[a:b]) for a, b in pieces[1:-1]} == {tuple(layer)}
    # No repeat: equal pieces of at most max_nodes; a short period is grouped into units of at least min_unit.
    assert layer_pieces(list(range(10)), max_nodes=4) == [(0, 3), (3, 6), (6, 10)]
    assert layer_pieces([1, 2] * 6, max_nodes=48, min_unit=4) == [(0, 4), (4, 8), (8, 12)]


def test_identical_layers_compile_one_function_per_kind_at_any_depth():
    feeds6 = {"x": RNG.standard_normal((1, 3, 8)).astype(np.float32)}
    six, plain6 = _sessions(_stack(6))
    twelve, _ = _sessions(_stack(12))
    assert _covered(six) == 6 * 6 + 1
    assert len(six.plan.regions) == 7  # six layer calls and the head
    assert len(_kinds(six)) == 2 and _kinds(twelve) == _kinds(six)
    for S in (3, 1):  # prefill- and decode-shaped feeds run the same compiled code
        feeds = {"x": RNG.standard_normal((1, S, 8)).astype(np.float32)}
        np.testing.assert_allclose(six.run(None, feeds)[0], plain6.run(None, feeds)[0], rtol=1e-5, atol=1e-5)
    assert all(len(r.fn.signatures) == 1 for r in six.plan.regions)
    np.testing.assert_allclose(twelve.run(None, feeds6)[0], InferenceSession(_stack(12)).run(None, feeds6)[0],
                               rtol=1e-5, atol=1e-5)


def _skip_stack(n_layers, width=8):
    """Layers closed by a skip norm, as decoder exports write them: each norm hands the next layer its residual
    sum (output 3), except the last, which has no reader for it and lacks the output."""
    r = np.random.default_rng(2)
    nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "g_in"], ["n0"], epsilon=1e-6, axis=-1)]
    inits = [numpy_helper.from_array(r.standard_normal(width).astype(np.float32), "g_in")]
    for l in range(n_layers):
        last = l == n_layers - 1
        nodes += [helper.make_node("MatMul", [f"n{l}", f"w{l}"], [f"h{l}"]),
                  helper.make_node("Sigmoid", [f"h{l}"], [f"s{l}"]),
                  helper.make_node("Mul", [f"h{l}", f"s{l}"], [f"a{l}"]),
                  helper.make_node("MatMul", [f"a{l}", f"u{l}"], [f"d{l}"]),
                  helper.make_node("Relu", [f"d{l}"], [f"e{l}"]),
                  helper.make_node("SkipSimplifiedLayerNormalization", [f"e{l}", "x" if l == 0 else f"r{l}", f"g{l}"],
                                   [f"n{l + 1}"] if last else [f"n{l + 1}", "", "", f"r{l + 1}"], domain=MS,
                                   epsilon=1e-6)]
        inits += [numpy_helper.from_array(r.standard_normal((width, 2 * width)).astype(np.float32), f"w{l}"),
                  numpy_helper.from_array(r.standard_normal((2 * width, width)).astype(np.float32) * 0.1, f"u{l}"),
                  numpy_helper.from_array(r.standard_normal(width).astype(np.float32), f"g{l}")]
    nodes.append(helper.make_node("MatMul", [f"n{n_layers}", "head"], ["y"]))
    inits.append(numpy_helper.from_array(r.standard_normal((width, 5)).astype(np.float32), "head"))
    return _model(nodes, [_vi("x", F, ["b", "s", width])], [_vi("y", F, None)], inits, opset=20)


def test_a_last_layer_without_its_residual_output_shares_the_layers_kind():
    """``ExposeSkipSums`` gives the last layer's norm the sum its siblings return, and a region returns every
    value its kind returns: four layers, one layer kind, the per-node plan's results."""
    fused, plain = _sessions(_skip_stack(4))
    layers = [r for r in fused.plan.regions if len(r.nodes) == 6]
    assert len(layers) == 4 and len({r.module_name for r in layers}) == 1
    assert len(_kinds(fused)) == 3  # the first norm, the layers, the head
    for S in (3, 1):
        feeds = {"x": RNG.standard_normal((2, S, 8)).astype(np.float32)}
        np.testing.assert_allclose(fused.run(None, feeds)[0], plain.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_expose_skip_sums_changes_only_norms_whose_siblings_expose_the_sum():
    from runtime.loader import load_graph
    from runtime.ir import ValueInfo
    from runtime.passes.layer_kinds import ExposeSkipSums
    g = load_graph(_skip_stack(3))
    last = [n for n in g.nodes if n.op_type == "SkipSimplifiedLayerNormalization"][-1]
    g.value_info[last.inputs[0]] = ValueInfo(last.inputs[0], np.dtype(np.float32), ("b", "s", 8))
    assert ExposeSkipSums()(g).modified and last.outputs[3] and last.outputs[1:3] == ["", ""]
    assert g.value_info[last.outputs[3]].shape == ("b", "s", 8)
    assert g.value_info[last.inputs[0]].name == last.inputs[0]  # a copy, the input's own info untouched
    assert not ExposeSkipSums()(g).modified
    lone = load_graph(_skip_stack(1))  # one norm, none exposing the sum: left as it is
    assert not ExposeSkipSums()(lone).modified


def test_layers_that_differ_in_an_attribute_do_not_share_code():
    feeds = {"x": RNG.standard_normal((1, 2, 8)).astype(np.float32)}
    kinds = []
    for eps in (1e-6, 10.0):  # two stacks whose layers differ from the other stack's only in epsilon
        fused, plain = _sessions(_stack(3, eps=lambda l: eps))
        np.testing.assert_allclose(fused.run(None, feeds)[0], plain.run(None, feeds)[0], rtol=1e-5, atol=1e-5)
        kinds.append(_kinds(fused))
    assert len(kinds[0] & kinds[1]) == 1  # the head is shared, the layers are not
    # Alternating epsilons: the repeated unit is a pair of layers.
    fused, plain = _sessions(_stack(6, eps=lambda l: 1e-6 if l % 2 else 10.0))
    assert [len(r.nodes) for r in fused.plan.regions] == [12, 12, 12, 1]
    np.testing.assert_allclose(fused.run(None, feeds)[0], plain.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_kernels_called_from_a_region_compile_once_for_any_flag_values():
    """The region pipeline types a constant passed to a kernel by its plain type: the norm and the skip norm
    (``has_skip``, ``want_stats`` ... written as constants) share one compile of ``row_norm``."""
    from ops import contrib_norm
    n = 8
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y"], epsilon=1e-6, axis=-1),
        helper.make_node("SkipSimplifiedLayerNormalization", ["y", "x", "g"], ["w", "", "", "sum"], domain=MS,
                         epsilon=1e-5),
    ]
    inits = [numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32), "g")]
    model = _model(nodes, [_vi("x", F, ["b", "s", n])], [_vi("w", F, None)], inits)
    fused = _check(model, {"x": RNG.standard_normal((2, 3, n)).astype(np.float32)}, len(nodes), exact=False)
    assert len({r.module_name for r in fused.plan.regions}) == 1
    sigs = [s for s in contrib_norm.row_norm.signatures if s[0].ndim == 3 and str(s[0].dtype) == "float32"]
    assert sigs and not any("Literal" in str(t) for s in sigs for t in s), sigs


_TWIN_FLAG = False


@njit(cache=False)
def _heavy(x):
    return x * 2


@njit(cache=False)
def _light(x):
    return x + 1


@njit(cache=False)
def _flagged(x):
    if _TWIN_FLAG and x > 0:
        return _heavy(x)
    return _light(x)


def test_a_constant_twin_compiles_only_its_own_branch():
    """``_common.constant_twin``: a branch on a global the twin fixes is dropped before typing, so the kernel
    only the other value calls is never compiled."""
    from ops import _common
    assert _flagged(3) == 4 and not _heavy.signatures
    twin = _common.constant_twin(_flagged, "_on", _TWIN_FLAG=True)
    assert twin(3) == 6 and _heavy.signatures and _flagged(3) == 4
    with pytest.raises(NameError, match="_NOT_THERE"):
        _common.constant_twin(_flagged, "_x", _NOT_THERE=True)


def test_an_error_inside_a_shared_layer_names_that_layers_node():
    nodes = []
    for l in range(4):
        nodes += [helper.make_node("Gather", [f"e{l}", "ids" if l == 0 else f"i{l - 1}"], [f"g{l}"], axis=0,
                                   name=f"gather{l}"),
                  helper.make_node("Cast", [f"g{l}"], [f"c{l}"], to=I64),
                  helper.make_node("ReduceSum", [f"c{l}", "ax"], [f"i{l}"], keepdims=0),
                  helper.make_node("Abs", [f"i{l}"], [f"a{l}"]), helper.make_node("Neg", [f"a{l}"], [f"b{l}"]),
                  helper.make_node("Abs", [f"b{l}"], [f"o{l}"])]
    # Layer 2's table holds a 9, out of range for layer 3's 5-row table.
    inits = [numpy_helper.from_array(np.full((5, 1), 9 if l == 2 else 1, np.float32), f"e{l}") for l in range(4)]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "ax"))
    model = _model(nodes, [_vi("ids", I64, ["s"])], [_vi(f"o{l}", I64, None) for l in range(4)], inits)
    fused, _ = _sessions(model)
    assert len(_kinds(fused)) < len(fused.plan.regions)
    with pytest.raises(IndexOutOfRangeError, match="'gather3'"):
        fused.run(None, {"ids": np.array([0], np.int64)})


# -- the region cache: faults end in a working session ----------------------------------------------

def _fresh(monkeypatch, folder):
    """Point the region cache at ``folder`` and forget the small model's generated module in this process."""
    import sys
    model = _model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
                    helper.make_node("Abs", ["b"], ["c"])], [_vi("x", F, [2, 3])], [_vi("c", F, None)])
    name = _sessions(model)[0].plan.regions[0].module_name
    sys.modules.pop(name, None)
    monkeypatch.setenv("ONNX_NUMBA_REGION_DIR", str(folder))
    return model, name


_X = np.array([[-1.5, 0.0, 2.0], [3.0, -4.0, 0.5]], np.float32)


def _works(model):
    sess = InferenceSession(model, _opts())
    np.testing.assert_array_equal(sess.run(None, {"x": _X})[0], np.abs(np.maximum(_X, 0)))
    return sess


def _opts():
    o = SessionOptions()
    o.compiled_regions = True
    return o


def test_a_cold_start_shows_its_progress_and_a_warm_one_prints_nothing(monkeypatch, tmp_path, capfd):
    import sys
    model, name = _fresh(monkeypatch, tmp_path)
    capfd.readouterr()
    _works(model)
    err = capfd.readouterr().err
    assert "compiling 1 region kind(s) of this model; this happens once" in err and "1/1" in err
    sys.modules.pop(name)
    _works(model)  # a new process would import the module and load Numba's cache: no bar
    assert "compiling" not in capfd.readouterr().err


def test_a_region_loaded_from_the_cache_keeps_only_its_machine_code(monkeypatch, tmp_path):
    """A region's cache entry names its symbols instead of carrying its IR for linking (nothing links a
    region), so loading it parses no copy of the kernels below it."""
    import sys
    model, name = _fresh(monkeypatch, tmp_path)
    _works(model)
    sys.modules.pop(name)
    sess = _works(model)  # the module imported again: Numba loads its cached entry
    (cres,) = sess.plan.regions[0].fn.overloads.values()
    bodies = [str(f) for f in cres.library._shared_module.functions if not f.is_declaration]
    assert bodies and all("unreachable" in b and "call" not in b for b in bodies)


def test_a_region_cache_that_cannot_be_created_warns_and_works(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    model, _ = _fresh(monkeypatch, blocker / "regions")
    with pytest.warns(RuntimeWarning, match="could not be cached in the region cache"):
        _works(model)


def test_a_full_disk_warns_and_compiles_from_memory(monkeypatch, tmp_path):
    import errno
    import runtime.regions as rg
    model, _ = _fresh(monkeypatch, tmp_path)

    def full(*a):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(rg.os, "replace", full)
    with pytest.warns(RuntimeWarning, match="No space left"):
        sess = _works(model)
    assert not list(tmp_path.glob("*.py")) and not list(tmp_path.glob("*.tmp"))
    assert sess.plan.regions[0].fn.__module__.startswith("onnx_numba_region_")


def test_damaged_cache_files_are_rebuilt(monkeypatch, tmp_path):
    import sys
    model, name = _fresh(monkeypatch, tmp_path)
    _works(model)
    sys.modules.pop(name)
    (tmp_path / f"{name}.py").write_text("garbage(")            # a torn write of the generated module
    _works(model)
    index = list((tmp_path / "__pycache__").glob(f"{name}.*.nbi"))
    assert index
    sys.modules.pop(name)
    index[0].write_bytes(b"garbage")                           # a damaged Numba index
    with pytest.warns(RuntimeWarning, match="damaged Numba cache file"):
        _works(model)
    sys.modules.pop(name)
    for data in (tmp_path / "__pycache__").glob(f"{name}.*.nbc"):
        data.write_bytes(b"\x80\x04garbage")                  # damaged compiled code
    with pytest.warns(RuntimeWarning, match="damaged Numba cache file"):
        _works(model)


def test_two_processes_compiling_the_same_kind_at_once_both_work(monkeypatch, tmp_path):
    import os
    import subprocess
    import sys
    monkeypatch.setenv("ONNX_NUMBA_REGION_DIR", str(tmp_path))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = ("import sys, numpy as np; sys.path.insert(0, sys.argv[1]); import tests.test_regions as t; "
              "m, _ = t._fresh(type('M', (), {'setenv': lambda *a: None})(), sys.argv[2]); t._works(m); print('ok')")
    # (the region folder reaches the children through the environment)
    procs = [subprocess.Popen([sys.executable, "-c", script, root, str(tmp_path)], cwd=root, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    assert all(o[0].strip() == "ok" for o in outs)
    assert not list(tmp_path.glob("*.tmp"))


def test_warm_compiles_a_package_ahead_and_a_second_warm_compiles_nothing(capsys):
    import os
    from pipeline.__main__ import main
    pkg = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "packages",
                       "llama_fp32")
    assert main(["warm", pkg]) == 0
    first = capsys.readouterr().out
    assert main(["warm", pkg]) == 0
    second = capsys.readouterr().out
    import re
    compiled, cached = (int(x) for x in re.search(r"(\d+) region kind\(s\) compiled, (\d+) already cached",
                                                  first).groups())
    # the fixture's decoder is three kinds (embedding, layer, head), compiled now or by an earlier test
    assert compiled + cached == 3
    assert "warmed" in second and ": 0 region kind(s) compiled, 3 already cached" in second


def test_warm_with_digests_records_the_data_files_and_later_damage_fails_the_load(tmp_path, capsys):
    """``warm --digests`` records each component's data file; one bit flipped in a weight afterwards (a valid
    value, which no value check sees) then fails the load, naming the tensor."""
    import os
    import shutil
    from pipeline.__main__ import main
    from runtime import InferenceSession
    from runtime.errors import ExternalDataDamagedError
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "packages",
                       "llama_fp32")
    pkg = tmp_path / "pkg"
    shutil.copytree(src, pkg)
    assert main(["warm", str(pkg), "--digests"]) == 0
    assert "recorded the digests of 1 data file(s)" in capsys.readouterr().out
    assert (pkg / "model.onnx.data.digests.json").is_file()
    InferenceSession(str(pkg / "model.onnx"))
    raw = bytearray((pkg / "model.onnx.data").read_bytes())
    raw[len(raw) // 2] ^= 1  # the lowest bit of a float32's mantissa (offsets are multiples of 4)
    (pkg / "model.onnx.data").write_bytes(bytes(raw))
    with pytest.raises(ExternalDataDamagedError, match=r"tensor '.+': bytes \[0, \d+\) of 'model.onnx.data' differ"):
        InferenceSession(str(pkg / "model.onnx"))


def _resident_kib(path):
    """Resident KiB of this process's mappings of ``path`` (from /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's header line
                inside = line.rstrip("\n").endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_a_repacked_weight_is_not_left_resident_in_its_memory_map(tmp_path):
    """A MatMul weight the region repacks into panels was read from its external-data map at planning; those
    pages are released, so the weight is resident once (as panels), and the session still computes right."""
    import onnx
    w = RNG.standard_normal((512, 1024)).astype(np.float32)  # 2 MiB
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    g = helper.make_graph(nodes, "g", [_vi("x", F, ["b", 512])], [_vi("y", F, None)],
                          initializer=[numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    path = tmp_path / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    sess = InferenceSession(str(path), _opts())
    assert sess.plan.regions
    assert _resident_kib(tmp_path / "m.data") < 256
    x = RNG.standard_normal((2, 512)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.maximum(x @ w, 0), rtol=1e-4, atol=1e-4)
