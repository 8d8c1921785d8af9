"""The decode loop on the composite VLM fixture: onnxruntime baseline, every native mix, transfers, backends."""
import numpy as np
import pytest

from fixtures import composite_vlm as V
from pipeline.backends import BackendChoice, BackendConfigError, choice_from_environment, parse_device
from pipeline.metadata import load_package
from pipeline.runner import Pipeline


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return V.build_package(str(tmp_path_factory.mktemp("vlm")))


def _run(package, native_components=(), native_decoder=False):
    spec = load_package(package)
    pipe = Pipeline(spec, BackendChoice(set(native_components), native_decoder, "cpu"))
    return pipe, pipe.generate(V.PROMPT_IDS, 4, external={"pixel_values": V.PIXELS})


def test_onnxruntime_baseline_is_pinned(package):
    pipe, ids = _run(package)
    assert ids == V.EXPECTED == [0, 5, 6, 7]
    assert {c.backend for c in pipe.components.values()} == {"ort"} and pipe.decoder.backend == "ort"


@pytest.mark.parametrize("components,decoder", [(["embedding"], False), ([], True),
                                                (["vision_encoder", "embedding"], True)])
def test_native_mixes_match_the_baseline(package, components, decoder):
    pipe, ids = _run(package, components, decoder)
    assert ids == V.EXPECTED
    for name in components:
        assert pipe.components[name].backend == "native"
    assert pipe.decoder.backend == ("native" if decoder else "ort")


def test_native_decoder_keeps_its_cache_resident(package):
    pipe, ids = _run(package, ["vision_encoder", "embedding"], True)
    t = pipe.decoder.transfers
    # In: the prompt's embeddings once, then one token's embedding per step; out: one argmax id per step.
    hidden = 4
    expected_in = (len(V.PROMPT_IDS) + 3) * hidden * 4
    assert t.largest_in == {"inputs_embeds": len(V.PROMPT_IDS) * hidden * 4}
    assert t.bytes_in == expected_in, "a KV cache crossed into the decoder"
    assert t.bytes_out == 4 * 8, "more than the argmax came out of the decoder"
    assert pipe.decoder.kv_length == len(V.PROMPT_IDS) + 3
    kv = pipe.decoder.kv["past_key_values.0.key"]
    # A buffer written in place, sized to what the request reaches (prompt plus new tokens), not max_length.
    assert kv.buf.shape[2] == len(V.PROMPT_IDS) + 4 < pipe.max_length


def test_kv_cache_past_max_length_is_refused(package):
    spec = load_package(package)
    pipe = Pipeline(spec, BackendChoice(set(), True, "cpu"), max_length=3)
    with pytest.raises(ValueError, match="max_length|maximum"):
        pipe.decoder.prefill(embeds=np.zeros((1, 4, 4), np.float32))


def test_backend_choice_from_environment():
    env = {"ONNX_NUMBA_NATIVE_COMPONENTS": "embedding,vision_encoder", "ONNX_NUMBA_NATIVE_DECODER": "decoder",
           "ONNX_NUMBA_NATIVE_DEVICE": "cpu"}
    c = choice_from_environment(["vision_encoder", "embedding"], "decoder", env)
    assert c.native_components == {"embedding", "vision_encoder"} and c.native_decoder and c.device == "cpu"
    assert choice_from_environment(["e"], "decoder", {"ONNX_NUMBA_NATIVE_DECODER": "all"}).native_decoder
    assert not choice_from_environment(["e"], "decoder", {}).native_decoder
    with pytest.raises(BackendConfigError, match="ONNX_NUMBA_NATIVE_COMPONENTS"):
        choice_from_environment(["embedding"], "decoder", {"ONNX_NUMBA_NATIVE_COMPONENTS": "embeding"})
    with pytest.raises(BackendConfigError, match="ONNX_NUMBA_NATIVE_DECODER"):
        choice_from_environment(["e"], "decoder", {"ONNX_NUMBA_NATIVE_DECODER": "yes please"})
    for bad in ("gpu", "cuda:x", "cpu:0", "CUDA0"):
        with pytest.raises(BackendConfigError, match="ONNX_NUMBA_NATIVE_DEVICE"):
            parse_device(bad)
    assert parse_device("cuda:1") == "cuda:1"


def test_cuda_device_without_a_cuda_provider_is_an_error(package, monkeypatch):
    from runtime import cuda as rc
    monkeypatch.setattr(rc, "available", lambda: False)
    spec = load_package(package)
    with pytest.raises(BackendConfigError, match="CUDA"):
        Pipeline(spec, BackendChoice(set(), True, "cuda"))


def test_native_sides_are_really_used(package, monkeypatch):
    """Perturbing the native embedding, then the native decoder, changes the tokens: the parity tests can fail."""
    from pipeline import components as C

    orig_run = C.NativeComponent.run

    def bad_embedding(self, feeds):
        out = orig_run(self, feeds)
        if self.name == "embedding":
            out = {k: v[..., ::-1].copy() for k, v in out.items()}
        return out

    monkeypatch.setattr(C.NativeComponent, "run", bad_embedding)
    assert _run(package, ["embedding"], False)[1] != V.EXPECTED
    monkeypatch.setattr(C.NativeComponent, "run", orig_run)

    orig_dec = C.NativeDecoder._run
    monkeypatch.setattr(C.NativeDecoder, "_run", lambda self, f, n: -orig_dec(self, f, n))
    assert _run(package, [], True)[1] != V.EXPECTED
    monkeypatch.setattr(C.NativeDecoder, "_run", orig_dec)
    assert _run(package, [], True)[1] == V.EXPECTED


def _state_package(folder, state_shape):
    import os

    import onnx
    import yaml
    from onnx import TensorProto, helper
    g = helper.make_graph(
        [helper.make_node("Cast", ["input_ids"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("ReduceSum", ["f"], ["s"], keepdims=1),
         helper.make_node("Add", ["state_in", "s"], ["state_out"]),
         helper.make_node("Expand", ["s", "shape8"], ["logits3"]),
         helper.make_node("Identity", ["logits3"], ["logits"])], "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("state_in", TensorProto.FLOAT, state_shape)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("state_out", TensorProto.FLOAT, None)],
        [helper.make_tensor("shape8", TensorProto.INT64, [3], [1, 1, 8])])
    os.makedirs(folder, exist_ok=True)
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
                    os.path.join(folder, "decoder.onnx"))
    meta = {"pipeline": {"models": {"decoder": {"filename": "decoder.onnx", "type": "decoder", "io": {
        "token_input": "input_ids", "logits_output": "logits",
        "state_pairs": [{"input": "state_in", "output": "state_out", "init": "zeros", "update": "replace"}]}}},
        "strategy": {"kind": "composite", "stages": [{"name": "decode", "strategy": {
            "kind": "autoregressive", "decoder": "decoder", "max_tokens": 3}, "run_on": "every_step"}]}}}
    with open(os.path.join(folder, "inference_metadata.yaml"), "w") as f:
        yaml.safe_dump(meta, f)
    return folder


@pytest.mark.parametrize("native", [False, True])
def test_loop_carried_state_starts_at_zeros_with_the_batch_axis_resolved(tmp_path, native):
    spec = load_package(_state_package(str(tmp_path / "p"), ["batch", 4]))
    pipe = Pipeline(spec, BackendChoice(set(), native, "cpu"))
    pipe.generate([2, 3], 3)
    # state = sum of every token fed so far: 2 + 3, then the generated tokens (argmax of equal logits: 0).
    np.testing.assert_array_equal(pipe.decoder.state["state_in"], np.full((1, 4), 5.0, np.float32))


def test_any_other_symbolic_state_dimension_is_an_error(tmp_path):
    from pipeline.spec import MetadataError
    spec = load_package(_state_package(str(tmp_path / "p"), ["batch", "width"]))
    pipe = Pipeline(spec, BackendChoice(set(), False, "cpu"))
    with pytest.raises(MetadataError, match=r"'state_in'.*axis 1"):
        pipe.generate([2, 3], 3)


@pytest.mark.parametrize("continuation", ["linear_increment", "carry_max"])
@pytest.mark.parametrize("batch", [1, 2])
def test_decoder_builds_masks_and_rank3_positions(continuation, batch):
    """The mask and mrope positions a decoder feeds itself: prefix of ones, three streams counting on from the
    cache length (linear_increment) or from each stream's previous maximum + 1 (carry_max)."""
    from types import SimpleNamespace
    from pipeline.components import DecoderComponent
    from pipeline.spec import IOSpec, Positions
    d = DecoderComponent.__new__(DecoderComponent)
    d.io = IOSpec(attention_mask_input="attention_mask", position_ids_input="position_ids")
    d.inputs = {"attention_mask": SimpleNamespace(type="tensor(int64)"),
                "position_ids": SimpleNamespace(type="tensor(int64)")}
    d.pipeline = SimpleNamespace(positions=Positions("position_ids", 3, continuation))
    d.batch, d.max_length = batch, 16
    d.cache = SimpleNamespace(length=0)
    d._positions_max, d._ones, d.row_lengths = None, None, None
    f = d._extras(4, None)
    assert f["attention_mask"].shape == (batch, 4) and (f["attention_mask"] == 1).all()
    assert f["attention_mask"].flags.c_contiguous and f["position_ids"].flags.c_contiguous
    np.testing.assert_array_equal(f["position_ids"], np.broadcast_to(np.arange(4), (3, batch, 4)))
    # A prompt whose image rows gave larger positions to some streams (fed by the caller): carry_max
    # continues from them, linear_increment from the cache length.
    d.cache.length, d._positions_max = 4, np.array([3, 9, 6])
    f = d._extras(1, None)
    assert f["attention_mask"].shape == (batch, 5)
    want = np.array([4, 10, 7]) if continuation == "carry_max" else np.array([4, 4, 4])
    np.testing.assert_array_equal(f["position_ids"], np.broadcast_to(want[:, None, None], (3, batch, 1)))
    d.cache.length = 5
    f = d._extras(2, None)
    want = want + 1 if continuation == "carry_max" else np.array([5, 5, 5])
    np.testing.assert_array_equal(f["position_ids"], want[:, None, None] + np.arange(2)[None, None, :]
                                  + np.zeros((3, batch, 2), np.int64))


def test_a_near_tie_is_onnxruntimes_own_gap_below_a_fixed_tolerance():
    """The parity report calls a divergence a near-tie from onnxruntime's top-2 gap alone, against a fixed
    tolerance (0.01 by default): however far the native logits are, a wide gap is not a near-tie."""
    from pipeline.__main__ import NEAR_TIE, divergence_line
    assert NEAR_TIE == 1e-2
    ort = np.array([0.0, 2.0, 2.004])   # gap 0.004: a near-tie
    far = np.array([9.0, 2.0, 1.0])     # native logits far from onnxruntime's: irrelevant to the call
    assert divergence_line(3, 2, 1, ort, far).endswith("(near-tie)")
    wide = np.array([0.0, 2.0, 2.5])    # gap 0.5
    assert divergence_line(3, 2, 1, wide, wide + 1e-7).endswith("(NOT a near-tie)")
    assert divergence_line(3, 2, 1, wide, wide, near_tie=1.0).endswith("(near-tie)")


def test_the_parity_report_names_the_native_arithmetic(monkeypatch):
    """The parity report says which order the native kernels run and how to get onnxruntime's."""
    from pipeline.__main__ import arithmetic_line
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "0")
    assert "its own order (ONNX_NUMBA_MLAS_ORDER=1 runs onnxruntime's" in arithmetic_line()
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    assert arithmetic_line() == ("native arithmetic: onnxruntime's order (ONNX_NUMBA_MLAS_ORDER=0 runs its own, "
                                 "with faster prompts)")
