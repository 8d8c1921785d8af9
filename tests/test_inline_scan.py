"""Single-trip Scan inlining and the decode sibling plan, on the hybrid decoder fixture."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from fixtures import hybrid_decoder as H
from runtime import InferenceSession, SessionOptions
from runtime.decode_sibling import ENV_FLAG, parse_flag, route_to_sibling
from runtime.ir import graph_from_proto
from runtime.passes import InferShapes, InlineSingleTripScan

CFG = H.SMALL
SPECS = H.state_specs(CFG)


@pytest.fixture(scope="module")
def model():
    return H.build(CFG)


def _session(model, flag):
    opts = SessionOptions()
    opts.decode_inline_scan = flag
    return InferenceSession(model, opts)


def _step(sess, feeds):
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _next_feeds(res, ids):
    feeds = {i: res[o] for i, o, _ in SPECS}
    feeds["input_ids"] = ids
    return feeds


PROMPT = np.array([[1, 5, 7, 2, 3], [4, 4, 9, 0, 1]], np.int64)


def test_decode_steps_are_byte_identical_scan_vs_inlined(model):
    plain, inlined = _session(model, False), _session(model, True)
    fa = H.zero_states(CFG, 2)
    fa["input_ids"] = PROMPT
    fb = dict(fa)
    for _ in range(6):
        ra, rb = _step(plain, fa), _step(inlined, fb)
        for k in ra:
            np.testing.assert_array_equal(ra[k], rb[k], err_msg=k)
        ids = np.argmax(ra["logits"][:, -1], -1)[:, None].astype(np.int64)
        fa, fb = _next_feeds(ra, ids), _next_feeds(rb, ids)
    assert inlined.plan_runs == {"main": 1, "sibling": 5}
    assert plain.plan_runs == {"main": 6, "sibling": 0}
    assert not any(n.op_type == "Scan" for n in inlined.decode_sibling.graph.nodes)
    for name in ("present.0.recurrent", "present.0.conv", "present.1.recurrent", "present.1.conv"):
        np.testing.assert_array_equal(ra[name], rb[name])


def test_routing_is_a_pure_decision():
    assert route_to_sibling(True, True, 1)
    assert not route_to_sibling(True, True, 5)       # prefill never runs the collapsed graph
    assert not route_to_sibling(False, True, 1)      # flag off
    assert not route_to_sibling(True, False, 1)      # sibling not built (or none)
    assert not route_to_sibling(True, True, None)    # extent unknown


def test_only_single_token_steps_reach_the_sibling(model):
    s = _session(model, True)
    feeds = H.zero_states(CFG, 1)
    feeds["input_ids"] = PROMPT[:1]
    r = _step(s, feeds)
    assert s.plan_runs == {"main": 1, "sibling": 0} and s.decode_sibling is None  # built lazily
    r = _step(s, _next_feeds(r, np.array([[3]], np.int64)))
    assert s.plan_runs == {"main": 1, "sibling": 1} and s.decode_sibling is not None
    r = _step(s, _next_feeds(r, np.array([[3, 4]], np.int64)))  # a multi-token step after decode
    assert s.plan_runs == {"main": 2, "sibling": 1}
    off = _session(model, False)
    _step(off, _next_feeds(r, np.array([[3]], np.int64)))
    assert off.plan_runs == {"main": 1, "sibling": 0} and off.decode_sibling is None


def test_state_continuity_across_the_prefill_to_decode_handoff(model):
    """Bound state buffers are the same objects before and after the hand-off, and hold the right values."""
    s, ref = _session(model, True), _session(model, False)
    feeds = H.zero_states(CFG, 1)
    feeds["input_ids"] = PROMPT[:1]
    rr = _step(ref, feeds)
    b = s.io_binding()
    present = {o: np.empty_like(rr[o]) for _, o, _ in SPECS if "key" not in o and "value" not in o}
    for name, arr in feeds.items():
        b.bind_input(name, arr)
    for o, buf in present.items():
        b.bind_output(o, buf)
    b.bind_output("logits")
    b.bind_output("present.2.key")
    b.bind_output("present.2.value")
    s.run_with_iobinding(b)  # prefill: main plan writes the state into the bound buffers
    assert s.plan_runs["main"] == 1
    ids = np.array([[int(np.argmax(rr["logits"][0, -1]))]], np.int64)
    rr2 = _step(ref, _next_feeds(rr, ids))
    # Decode: the present buffers written by prefill are bound as the next step's past, as they are.
    b2 = s.io_binding()
    outs = b.get_output_arrays()
    names = list(present) + ["logits", "present.2.key", "present.2.value"]
    got = dict(zip(names, outs))
    for i, o, _ in SPECS:
        b2.bind_input(i, got[o])
    b2.bind_input("input_ids", ids)
    nxt = {o: np.empty_like(buf) for o, buf in present.items()}
    for o, buf in nxt.items():
        b2.bind_output(o, buf)
    b2.bind_output("logits")
    s.run_with_iobinding(b2)
    assert s.plan_runs == {"main": 1, "sibling": 1}
    for o, buf in present.items():
        assert got[o] is buf  # the prefill state reached the sibling as the very same buffer
    res = dict(zip(list(nxt) + ["logits"], b2.get_output_arrays()))
    for o, buf in nxt.items():
        assert res[o] is buf
        np.testing.assert_array_equal(buf, rr2[o])
    np.testing.assert_array_equal(res["logits"], rr2["logits"])


def test_state_outputs_keep_order_and_inlined_shapes_resolve(model):
    s = _session(model, True)
    feeds = H.zero_states(CFG, 1)
    feeds["input_ids"] = np.array([[2]], np.int64)
    s.run(None, feeds)
    sib = s.decode_sibling.graph
    assert [o.name for o in sib.outputs] == ["logits"] + [o for _, o, _ in SPECS]
    assert [i.name for i in sib.inputs] == [i.name for i in s._graph.inputs]
    assert [n for n, why in sib.inline_details if why != "inlined"] == []
    inlined = [n for n in sib.nodes if "/Scan/" in n.name]
    assert inlined
    for n in inlined:
        for o in n.outputs:
            vi = sib.value_info.get(o)
            assert vi is not None and vi.shape is not None, f"{o} has no inferred shape"
            # Every dimension is known, as a number or a symbol (batch, or a product onnx names unk__N).
            assert all(d is not None for d in vi.shape), (o, vi.shape)
            assert vi.dtype is not None, o


def test_pass_reports_failed_preconditions(model):
    g = graph_from_proto(model.graph, {"": H.OPSET})
    InferShapes()(g)
    res = InlineSingleTripScan()(g)  # sequence axis is symbolic here
    assert not res.modified
    assert res.details and all("not a static 1" in why for _, why in res.details)


def test_no_sibling_for_a_dense_graph():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "dense",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])])
    s = _session(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), True)
    s.run(None, {"x": np.ones((1, 1), np.float32)})
    assert s.decode_sibling is None and s.plan_runs == {"main": 1, "sibling": 0}


@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), ("yes", True), ("on", True),
                                            ("TRUE", True), (" on ", True), ("0", False), ("false", False),
                                            ("no", False), ("off", False), ("", False), (None, False),
                                            (True, True), (False, False)])
def test_flag_parser(value, expected):
    assert parse_flag(value) is expected


@pytest.mark.parametrize("value", ["2", "y", "enable"])
def test_flag_parser_refuses_what_it_does_not_know(value):
    from runtime.settings import SettingError
    with pytest.raises(SettingError, match="decode_inline_scan"):
        parse_flag(value)


def test_environment_variable_turns_the_sibling_on(model, monkeypatch):
    monkeypatch.setenv(ENV_FLAG, "yes")
    s = InferenceSession(model)
    feeds = H.zero_states(CFG, 1)
    feeds["input_ids"] = np.array([[2]], np.int64)
    s.run(None, feeds)
    assert s.plan_runs["sibling"] == 1
    monkeypatch.setenv(ENV_FLAG, "off")
    s = InferenceSession(model)
    s.run(None, feeds)
    assert s.plan_runs["sibling"] == 0
    monkeypatch.setenv(ENV_FLAG, "nope")
    from runtime.settings import SettingError
    with pytest.raises(SettingError, match="ONNX_NUMBA_DECODE_INLINE_SCAN='nope'"):
        InferenceSession(model)


def test_pipeline_native_decoder_uses_the_sibling_when_the_flag_is_on(tmp_path, monkeypatch):
    from pipeline.backends import BackendChoice
    from pipeline.metadata import load_package
    from pipeline.runner import Pipeline

    spec = load_package(H.build_package(str(tmp_path / "hybrid")))
    prompt = [1, 5, 7, 2]
    monkeypatch.setenv(ENV_FLAG, "1")
    on = Pipeline(spec, BackendChoice(set(), True, "cpu"))
    ids_on = on.generate(prompt, 8)
    assert on.decoder.session.plan_runs == {"main": 1, "sibling": 7}
    monkeypatch.setenv(ENV_FLAG, "0")
    off = Pipeline(spec, BackendChoice(set(), True, "cpu"))
    assert off.generate(prompt, 8) == ids_on
    assert off.decoder.session.plan_runs == {"main": 8, "sibling": 0}


def test_one_sibling_per_batch_size(model):
    s, ref = _session(model, True), _session(model, False)
    for batch in (1, 2, 1):
        feeds = H.zero_states(CFG, batch)
        feeds["input_ids"] = PROMPT[:batch]
        ra, rb = _step(ref, feeds), _step(s, feeds)
        ids = np.argmax(ra["logits"][:, -1], -1)[:, None].astype(np.int64)
        ra, rb = _step(ref, _next_feeds(ra, ids)), _step(s, _next_feeds(rb, ids))
        for k in ra:
            np.testing.assert_array_equal(ra[k], rb[k], err_msg=k)
    assert sorted(s._siblings) == [(1,), (2,)]
    assert s.plan_runs == {"main": 3, "sibling": 3}
