"""The native decoder on the CUDA provider (pipeline/device_decoder.py): greedy parity with the CPU decoder,
host<->device transfers per step (only the token / embedding up, only the logits / argmax down), the
no-silent-fallback rule for decoders with nodes lacking a CUDA kernel, and the max_length guard.

Without a GPU the kernels run on Numba's CUDA simulator, where every CUDA thread is a Python thread, so
shapes are tiny.

Numba picks the simulator or the real driver when ``numba.cuda`` is first imported, and ``runtime.cuda``
defers that import to first use, so setting ``NUMBA_ENABLE_CUDASIM`` here works under xdist too: no other
module imports ``numba.cuda`` (``import ops`` imports only ``ops/cuda/__init__.py``, which loads no kernel).

When numba-cuda is missing (or finds no GPU and the simulator is off) the module is skipped, unless
``ONNX_NUMBA_REQUIRE_CUDA=1``, in which case collecting it fails.
"""
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import cuda as rc  # importing runtime.cuda never imports numba.cuda

from cuda_target import use_cuda_or_skip  # noqa: E402

use_cuda_or_skip("CUDA decoder")

from fixtures import composite_vlm as V  # noqa: E402
from pipeline.backends import BackendChoice, choice_from_environment  # noqa: E402
from pipeline.components import NativeDecoder  # noqa: E402
from pipeline.device_decoder import CudaDecoder  # noqa: E402
from pipeline.metadata import load_package  # noqa: E402
from pipeline.runner import Pipeline  # noqa: E402
from runtime.errors import UnsupportedOpError  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64
CUDA = BackendChoice(set(), True, "cuda")
CPU = BackendChoice(set(), True, "cpu")


@pytest.fixture(scope="module")
def vlm_package(tmp_path_factory):
    return V.build_package(str(tmp_path_factory.mktemp("vlm")))


# -- a tiny token-id decoder that reads everything the decoder builds ------------------------------------
# Hidden 4, vocab 8, 2 KV heads (so the live cache prefix is not a contiguous view and is compacted on the
# device), one state pair; the attention mask and position ids are read by device kernels (Transpose) and
# echoed as outputs, so a test can check their values.  (The CUDA Cast converts float32<->float16 only, so the
# integer inputs cannot feed arithmetic here.)
VOCAB, HID, HEADS = 8, 4, 2


def _toy_model():
    rng = np.random.default_rng(3)
    inits = {"embed": rng.standard_normal((VOCAB, HID)).astype(np.float32),
             "w_out": rng.standard_normal((HID, VOCAB)).astype(np.float32),
             "half": np.array(0.5, np.float32),
             "ax1": np.array([1], np.int64),
             "last_s": np.array([-1], np.int64), "last_e": np.array([1 << 30], np.int64),
             "h0_s": np.array([0], np.int64), "h0_e": np.array([1], np.int64)}
    n = helper.make_node
    nodes = [
        n("Gather", ["embed", "input_ids"], ["x"], axis=0),                # (B, S, 4); ids are a host input
        n("Unsqueeze", ["x", "ax1"], ["x_h"]),                              # (B, 1, S, 4)
        n("Concat", ["x_h", "x_h"], ["new_kv"], axis=1),                    # (B, 2, S, 4)
        n("Concat", ["past_key_values.0.key", "new_kv"], ["present.0.key"], axis=2),
        n("Concat", ["past_key_values.0.value", "new_kv"], ["present.0.value"], axis=2),
        n("Transpose", ["present.0.key"], ["k_t"], perm=[0, 1, 3, 2]),      # (B, 2, 4, T)
        n("MatMul", ["new_kv", "k_t"], ["scores"]),                         # (B, 2, S, T)
        n("Softmax", ["scores"], ["probs"], axis=-1),
        n("MatMul", ["probs", "present.0.value"], ["att"]),                 # (B, 2, S, 4)
        n("Slice", ["att", "h0_s", "h0_e", "ax1"], ["att0"]),               # (B, 1, S, 4)
        n("Squeeze", ["att0", "ax1"], ["att_s"]),                           # (B, S, 4)
        n("Unsqueeze", ["state_in", "ax1"], ["st_u"]),                      # (B, 1, 4)
        n("Add", ["att_s", "st_u"], ["h1"]),
        n("Add", ["h1", "x"], ["h"]),
        n("MatMul", ["h", "w_out"], ["logits"]),                            # (B, S, 8)
        n("Slice", ["x", "last_s", "last_e", "ax1"], ["x_last"]),           # (B, 1, 4)
        n("Squeeze", ["x_last", "ax1"], ["x_l"]),
        n("Mul", ["state_in", "half"], ["st_half"]),
        n("Add", ["st_half", "x_l"], ["state_out"]),
        # Transpose, unlike Concat/Slice/Expand on integers, is not run on the host by the CUDA plan.
        n("Transpose", ["attention_mask"], ["mask_echo"], perm=[1, 0]),
        n("Transpose", ["position_ids"], ["pos_echo"], perm=[1, 0]),
    ]
    kv = ["batch", HEADS, "past_seq", HID]
    g = helper.make_graph(
        nodes, "toy_decoder",
        [helper.make_tensor_value_info("input_ids", I64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", I64, ["batch", "total_seq"]),
         helper.make_tensor_value_info("position_ids", I64, ["batch", "seq"]),
         helper.make_tensor_value_info("past_key_values.0.key", F, kv),
         helper.make_tensor_value_info("past_key_values.0.value", F, kv),
         helper.make_tensor_value_info("state_in", F, ["batch", HID])],
        [helper.make_tensor_value_info("logits", F, ["batch", "seq", VOCAB]),
         helper.make_tensor_value_info("present.0.key", F, ["batch", HEADS, "total_seq", HID]),
         helper.make_tensor_value_info("present.0.value", F, ["batch", HEADS, "total_seq", HID]),
         helper.make_tensor_value_info("state_out", F, ["batch", HID]),
         helper.make_tensor_value_info("mask_echo", I64, None),
         helper.make_tensor_value_info("pos_echo", I64, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _decoder_package(folder, model, state_pairs=()):
    """``model`` as the one decoder of an inference_metadata package in ``folder`` (its cache and state ports as
    the test models name them); returns ``folder``."""
    import onnx
    import yaml
    onnx.save_model(model, os.path.join(folder, "decoder.onnx"))
    io = {"token_input": "input_ids", "logits_output": "logits", "attention_mask_input": "attention_mask",
          "position_ids_input": "position_ids",
          "kv_inputs": ["past_key_values.0.key", "past_key_values.0.value"],
          "kv_outputs": ["present.0.key", "present.0.value"]}
    if state_pairs:
        io["state_pairs"] = list(state_pairs)
    meta = {"pipeline": {"models": {"decoder": {"filename": "decoder.onnx", "type": "decoder", "io": io}},
            "strategy": {"kind": "composite", "stages": [{"name": "decode", "strategy": {
                "kind": "autoregressive", "decoder": "decoder", "max_tokens": 4}, "run_on": "every_step"}]}}}
    with open(os.path.join(folder, "inference_metadata.yaml"), "w") as f:
        yaml.safe_dump(meta, f)
    return folder


@pytest.fixture(scope="module")
def toy_package(tmp_path_factory):
    return _decoder_package(str(tmp_path_factory.mktemp("toy")), _toy_model(), [
        {"input": "state_in", "output": "state_out", "init": "zeros", "update": "replace"}])

def _decoders(package, batch=1, max_length=16):
    spec = load_package(package)
    return (CudaDecoder(spec.decoder, spec, max_length, batch, ["CUDAExecutionProvider"]),
            NativeDecoder(spec.decoder, spec, max_length, batch, ["CPUExecutionProvider"]))


# -- 1. the composite fixture decodes [0, 5, 6, 7] on CUDA and on the CPU --------------------------------

@pytest.mark.parametrize("choice,argmax", [(CUDA, True), (CUDA, False), (CPU, True)],
                         ids=["cuda-argmax", "cuda-logits", "cpu"])
def test_composite_fixture_decodes_the_closed_form(vlm_package, choice, argmax):
    pipe = Pipeline(load_package(vlm_package), choice)
    ids = pipe.generate(V.PROMPT_IDS, 4, external={"pixel_values": V.PIXELS}, want_argmax=argmax)
    assert ids == V.EXPECTED == [0, 5, 6, 7]
    assert pipe.decoder.backend == "native"
    assert isinstance(pipe.decoder, CudaDecoder) == (choice.device == "cuda")
    if choice.device == "cuda":
        buf = pipe.decoder.kv["past_key_values.0.key"].buf
        assert rc.is_device_array(buf) and buf.shape[2] == pipe.max_length  # static, on the device
        assert pipe.decoder.kv_length == len(V.PROMPT_IDS) + 3


def test_environment_selects_the_cuda_decoder(vlm_package):
    spec = load_package(vlm_package)
    env = {"ONNX_NUMBA_NATIVE_DECODER": "decoder", "ONNX_NUMBA_NATIVE_DEVICE": "cuda:0"}
    choice = choice_from_environment(["vision_encoder", "embedding"], "decoder", env)
    pipe = Pipeline(spec, choice)
    assert isinstance(pipe.decoder, CudaDecoder) and pipe.decoder.device == "cuda:0"
    assert pipe.generate(V.PROMPT_IDS, 4, external={"pixel_values": V.PIXELS}) == V.EXPECTED


def _check_echoes(dec, batch, start, seq):
    """The mask and position ids the decoder bound on the device (echoed by the toy model; test-only download)."""
    mask = rc.to_host(dec.last_results["mask_echo"])
    pos = rc.to_host(dec.last_results["pos_echo"])
    np.testing.assert_array_equal(mask, np.ones((start + seq, batch), np.int64))
    np.testing.assert_array_equal(pos, np.tile(np.arange(start, start + seq, dtype=np.int64), (batch, 1)).T)


@pytest.mark.parametrize("batch", [1, 2])
def test_token_decoder_logits_match_the_cpu_decoder(toy_package, batch):
    """KV compaction (2 heads), the state pair, device mask and positions (batch 2: the position kernel)."""
    cuda_dec, cpu_dec = _decoders(toy_package, batch)
    prompt = np.array([[3, 1, 4], [2, 7, 1]][:batch], np.int64)
    got, want = cuda_dec.prefill(tokens=prompt), cpu_dec.prefill(tokens=prompt)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    _check_echoes(cuda_dec, batch, 0, 3)
    for k in range(3):
        tok = np.argmax(want, axis=-1).astype(np.int64).reshape(batch, 1)
        got, want = cuda_dec.step(tokens=tok), cpu_dec.step(tokens=tok)
        assert got.shape == (batch, VOCAB)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert cuda_dec.kv_length == cpu_dec.kv_length == 4 + k
        _check_echoes(cuda_dec, batch, 3 + k, 1)
    np.testing.assert_allclose(cuda_dec.state_to_host()["state_in"], cpu_dec.state["state_in"], rtol=1e-5)
    # the argmax computed on the device is the first maximum, like the CPU decoder's
    tok = np.argmax(want, axis=-1).astype(np.int64).reshape(batch, 1)
    a, b = cuda_dec.step(tokens=tok, want="argmax"), cpu_dec.step(tokens=tok, want="argmax")
    assert a.dtype == np.int64 and a.shape == (batch,)
    np.testing.assert_array_equal(a, b)


# -- 2. transfers: per step only the token (or embedding) up and the logits / argmax down ---------------

def test_composite_transfers_per_step_are_the_embedding_and_the_argmax(vlm_package):
    pipe = Pipeline(load_package(vlm_package), CUDA)
    with rc.TransferCounter() as tc:
        ids = pipe.generate(V.PROMPT_IDS, 4, external={"pixel_values": V.PIXELS})
    assert ids == V.EXPECTED
    t = pipe.decoder.transfers
    emb = V.HIDDEN * 4
    # prefill: the prompt's embeddings up; then one token's embedding per step; one int64 argmax down each
    assert [s["h2d"] for s in t.steps] == [len(V.PROMPT_IDS) * emb] + [emb] * 3
    assert [s["d2h"] for s in t.steps] == [8] * 4
    assert all(s["h2d_calls"] == 1 and s["d2h_calls"] == 1 for s in t.steps)
    # nothing else crossed during the whole generation (the other components run on onnxruntime)
    assert (tc.h2d, tc.d2h) == (t.h2d, t.d2h) == (t.bytes_in, t.bytes_out)
    cache = pipe.decoder.kv["past_key_values.0.key"].buf
    cache_bytes = cache.size * 4
    assert max(s["h2d"] + s["d2h"] for s in t.steps[1:]) * 8 < cache_bytes


@pytest.mark.parametrize("batch", [1, 2])
def test_token_decoder_moves_only_the_ids_and_the_outputs(toy_package, batch):
    cuda_dec, _ = _decoders(toy_package, batch, max_length=16)
    cuda_dec.prefill(tokens=np.ones((batch, 3), np.int64))
    for k in range(2):  # a logits step, then an argmax step
        want = "argmax" if k % 2 else "logits"
        with rc.TransferCounter() as tc:
            cuda_dec.step(tokens=np.full((batch, 1), k, np.int64), want=want)
        # up: the token ids only -- the mask (ones) and the position ids stay on the device
        assert tc.h2d == batch * 8 and tc.h2d_calls == 1, tc
        # down: the last position's logits, or the argmax
        assert tc.d2h == (batch * 8 if want == "argmax" else batch * VOCAB * 4) and tc.d2h_calls == 1, tc
        assert cuda_dec.transfers.steps[-1]["h2d"] == tc.h2d and cuda_dec.transfers.steps[-1]["d2h"] == tc.d2h
    # a KV cache (or even the live part of one) is far bigger than what crossed
    live = batch * HEADS * cuda_dec.kv_length * HID * 4
    assert tc.h2d + tc.d2h < live // 4
    assert cuda_dec.transfers.largest_in == {"input_ids": batch * 3 * 8}
    assert all(rc.is_device_array(v) for v in cuda_dec.state.values())


# -- 3. state pairs: the hybrid fixture needs kernels CUDA lacks: creation fails naming them -------------

def test_hybrid_decoder_without_cuda_kernels_fails_at_creation(tmp_path):
    from fixtures import hybrid_decoder as hd
    spec = load_package(hd.build_package(str(tmp_path / "hybrid")))
    try:
        pipe = Pipeline(spec, CUDA, max_length=8)
    except UnsupportedOpError as e:
        msg = str(e)
        assert e.nodes and e.provider == "CUDAExecutionProvider"
        for name, op_type, _, _ in e.nodes:
            assert repr(name) in msg and repr(op_type) in msg
        return
    # Every kernel exists: then it must agree with the CPU decoder and keep its state on the device.
    cpu = Pipeline(spec, CPU, max_length=8)
    assert pipe.generate([1, 2, 3], 3) == cpu.generate([1, 2, 3], 3)
    assert all(rc.is_device_array(v) for v in pipe.decoder.state.values())


# -- 4. past max_length: a clear error, nothing corrupted -----------------------------------------------

def test_beam_reorder_stays_on_the_device_and_matches_the_cpu_decoder(toy_package):
    """Beam search's reorder (caches and the state pair, rows gathered on the device): the same logits and state
    as the CPU decoder's host reorder, the static buffer kept, and only the row indices moved (8 bytes a row, once
    for each array reordered: two caches and the state)."""
    cuda_dec, cpu_dec = _decoders(toy_package, 3)
    prompt = np.array([[3, 1, 4], [2, 7, 1], [5, 5, 0]], np.int64)
    got, want = cuda_dec.prefill(tokens=prompt), cpu_dec.prefill(tokens=prompt)
    buf = cuda_dec.kv["past_key_values.0.key"].buf
    for parents in ([2, 0, 0], [1, 2, 1]):
        tok = np.argmax(want, axis=-1).astype(np.int64).reshape(3, 1)
        got, want = cuda_dec.step(tokens=tok), cpu_dec.step(tokens=tok)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        with rc.TransferCounter() as tc:
            cuda_dec.reorder(parents)
        cpu_dec.reorder(parents)
        assert (tc.h2d, tc.d2h) == (3 * 3 * 8, 0)
        assert tc.kernels.get("device_decoder._take_live_kernel") == 2   # the caches: their live rows only
        assert cuda_dec.kv["past_key_values.0.key"].buf is buf and rc.is_device_array(cuda_dec.state["state_in"])
    tok = np.array([[1], [6], [3]], np.int64)
    got, want = cuda_dec.step(tokens=tok), cpu_dec.step(tokens=tok)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cuda_dec.state_to_host()["state_in"], cpu_dec.state["state_in"], rtol=1e-5)
    assert not np.allclose(got[0], got[1])   # the rows differ: a reorder that moved nothing would show



def _gqa_model():
    """A decoder of one GroupQueryAttention layer (2 query heads, 1 KV head of size 2, no rotary), learned
    positions, no state: a right-padded batch runs on it with each row's mask and positions."""
    rng = np.random.default_rng(5)
    inits = {"embed": rng.standard_normal((VOCAB, HID)).astype(np.float32),
             "pos_table": rng.standard_normal((16, HID)).astype(np.float32),
             "w_qkv": rng.standard_normal((HID, 8)).astype(np.float32),
             "w_out": rng.standard_normal((HID, VOCAB)).astype(np.float32),
             "ax1": np.array([1], np.int64), "one": np.array([1], np.int64), "two": np.array([2], np.int64)}
    n = helper.make_node
    nodes = [
        n("Gather", ["embed", "input_ids"], ["tok"], axis=0),                # (B, S, 4)
        n("Gather", ["pos_table", "position_ids"], ["pe"], axis=0),
        n("Add", ["tok", "pe"], ["x"]),
        n("MatMul", ["x", "w_qkv"], ["qkv"]),                                # (B, S, 2*2 + 2*1*2)
        n("ReduceSum", ["attention_mask", "ax1"], ["len64"], keepdims=0),
        n("Sub", ["len64", "one"], ["sk64"]), n("Cast", ["sk64"], ["seqlens_k"], to=TensorProto.INT32),
        n("Shape", ["attention_mask"], ["mshape"]), n("Slice", ["mshape", "one", "two"], ["tot64"]),
        n("Cast", ["tot64"], ["total"], to=TensorProto.INT32),
        n("GroupQueryAttention", ["qkv", "", "", "past_key_values.0.key", "past_key_values.0.value", "seqlens_k",
                                  "total"], ["att", "present.0.key", "present.0.value"], domain="com.microsoft",
          num_heads=2, kv_num_heads=1),                                      # (B, S, 4)
        n("Add", ["att", "x"], ["h"]),
        n("MatMul", ["h", "w_out"], ["logits"]),
        n("Transpose", ["attention_mask"], ["mask_echo"], perm=[1, 0]),   # a device kernel reads the mask
    ]
    kv = ["batch", 1, "past_seq", 2]
    g = helper.make_graph(
        nodes, "gqa_decoder",
        [helper.make_tensor_value_info("input_ids", I64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", I64, ["batch", "total_seq"]),
         helper.make_tensor_value_info("position_ids", I64, ["batch", "seq"]),
         helper.make_tensor_value_info("past_key_values.0.key", F, kv),
         helper.make_tensor_value_info("past_key_values.0.value", F, kv)],
        [helper.make_tensor_value_info("logits", F, ["batch", "seq", VOCAB]),
         helper.make_tensor_value_info("present.0.key", F, ["batch", 1, "total_seq", 2]),
         helper.make_tensor_value_info("present.0.value", F, ["batch", 1, "total_seq", 2]),
         helper.make_tensor_value_info("mask_echo", I64, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def gqa_package(tmp_path_factory):
    return _decoder_package(str(tmp_path_factory.mktemp("gqa")), _gqa_model())

@pytest.mark.parametrize("shared", [True, False], ids=["shared", "copied"])
def test_rows_of_different_lengths_match_the_cpu_decoder(gqa_package, shared):
    """A right-padded batch (rows of 3, 2 and 1 real tokens): each row's last real logits, then steps at each
    row's own end, equal the CPU decoder's (which runs the same batch) and each row's run alone; the rows' masks
    are the ones bound (read back through a device kernel); per step the tokens, positions and masks go up, plus
    the rows' last positions after the prompt, and the logits come down, with the caches shared (written in
    place) or copied."""
    from runtime import SessionOptions
    opts = SessionOptions()
    opts.kv_share_buffer = shared
    spec = load_package(gqa_package)
    cuda_dec = CudaDecoder(spec.decoder, spec, 8, 3, ["CUDAExecutionProvider"], options=opts)
    cpu_dec = NativeDecoder(spec.decoder, spec, 8, 3, ["CPUExecutionProvider"])
    alone = [NativeDecoder(spec.decoder, spec, 8, 1, ["CPUExecutionProvider"]) for _ in range(3)]
    prompt = np.array([[3, 1, 4], [2, 7, 0], [5, 0, 0]], np.int64)
    lengths = np.array([3, 2, 1])
    got = cuda_dec.prefill(tokens=prompt, lengths=lengths)
    want = cpu_dec.prefill(tokens=prompt, lengths=lengths)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for b, dec in enumerate(alone):
        np.testing.assert_allclose(got[b], dec.prefill(tokens=prompt[b:b + 1, :lengths[b]])[0], rtol=1e-5, atol=1e-5)
    # up: the tokens, the positions (the learned-position Gather reads them on the device), the rows' mask (a
    # device kernel reads it; rows of one length bind a device buffer of ones and the plan downloads it instead),
    # the rows' last positions, and GroupQueryAttention's per-row lengths (int32; uploaded once per distinct
    # content in the process, so maybe not again here)
    seqlens = 3 * 4

    def mask_checked(total):
        mask = (np.arange(total)[None, :] < cuda_dec.row_lengths[:, None]).astype(np.int64)
        np.testing.assert_array_equal(rc.to_host(cuda_dec.last_results["mask_echo"]).T, mask)
        return mask.nbytes

    assert cuda_dec.transfers.steps[-1]["h2d"] - (2 * prompt.nbytes + mask_checked(3) + 3 * 8) in (0, seqlens)
    for k in range(2):
        tok = np.argmax(want, axis=-1).astype(np.int64).reshape(3, 1)
        got, want = cuda_dec.step(tokens=tok), cpu_dec.step(tokens=tok)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        for b, dec in enumerate(alone):
            np.testing.assert_allclose(got[b], dec.step(tokens=tok[b:b + 1])[0], rtol=1e-5, atol=1e-5)
        step = cuda_dec.transfers.steps[-1]
        assert step["h2d"] - (2 * tok.nbytes + mask_checked(4 + k)) in (0, seqlens) and step["d2h"] == got.nbytes
    np.testing.assert_array_equal(cuda_dec.row_lengths, [5, 4, 3])
    assert cuda_dec.kv_length == cpu_dec.kv_length == 5
    a, b = cuda_dec.step(tokens=tok, want="argmax"), cpu_dec.step(tokens=tok, want="argmax")
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(got[0], got[1]) and not np.allclose(got[1], got[2])


def test_rows_of_different_lengths_on_recurrent_state_run_each_row_alone_first(toy_package):
    """A padded batch on a decoder with recurrent state: its first run takes each row alone (no pad reaches the
    state), as the CPU decoder does, and leaves caches and state on the device; later steps run batched; a later
    run of several positions with rows of different lengths is refused before anything runs."""
    cuda_dec, cpu_dec = _decoders(toy_package, 2)
    alone = [_decoders(toy_package, 1)[1] for _ in range(2)]
    prompt = np.array([[3, 1, 4], [2, 7, 0]], np.int64)
    lengths = np.array([3, 2])
    got, want = cuda_dec.prefill(tokens=prompt, lengths=lengths), cpu_dec.prefill(tokens=prompt, lengths=lengths)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for b, dec in enumerate(alone):
        np.testing.assert_allclose(got[b], dec.prefill(tokens=prompt[b:b + 1, :lengths[b]])[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(cuda_dec.state_to_host()["state_in"][b], dec.state["state_in"][0], rtol=1e-5)
    assert rc.is_device_array(cuda_dec.state["state_in"])
    assert all(rc.is_device_array(r.buf) for r in cuda_dec.kv.values())
    for _ in range(2):
        tok = np.argmax(want, axis=-1).astype(np.int64).reshape(2, 1)
        got, want = cuda_dec.step(tokens=tok), cpu_dec.step(tokens=tok)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cuda_dec.state_to_host()["state_in"], cpu_dec.state["state_in"], rtol=1e-5)
    np.testing.assert_array_equal(cuda_dec.row_lengths, [5, 4])
    calls, length = cuda_dec.transfers.calls, cuda_dec.kv_length
    with pytest.raises(NotImplementedError, match="first run only"):
        cuda_dec.step(tokens=np.array([[1, 2], [3, 0]], np.int64), lengths=[2, 1])
    assert cuda_dec.transfers.calls == calls and cuda_dec.kv_length == length


def test_cache_past_max_length_is_refused_and_corrupts_nothing(toy_package):
    cuda_dec, cpu_dec = _decoders(toy_package, 1, max_length=4)
    with pytest.raises(ValueError, match="max_length"):
        cuda_dec.prefill(tokens=np.ones((1, 5), np.int64))
    assert cuda_dec.kv is None and cuda_dec.kv_length == 0 and cuda_dec.transfers.calls == 0
    prompt = np.array([[3, 1, 4]], np.int64)
    cuda_dec.prefill(tokens=prompt)
    cpu_dec.prefill(tokens=prompt)
    np.testing.assert_allclose(cuda_dec.step(tokens=[[2]]), cpu_dec.step(tokens=[[2]]), rtol=1e-5, atol=1e-5)
    before = {k: rc.to_host(b.buf) for k, b in cuda_dec.kv.items()}
    state = cuda_dec.state_to_host()
    with pytest.raises(ValueError, match="past max_length 4"):
        cuda_dec.step(tokens=[[5]])
    assert cuda_dec.kv_length == 4
    for k, b in cuda_dec.kv.items():
        np.testing.assert_array_equal(rc.to_host(b.buf), before[k])
        assert b.length == 4
    np.testing.assert_array_equal(cuda_dec.state_to_host()["state_in"], state["state_in"])


def test_rewind_reuses_the_static_buffer(vlm_package):
    spec = load_package(vlm_package)
    dec = CudaDecoder(spec.decoder, spec, 8, 1, ["CUDAExecutionProvider"])
    x = np.eye(4, dtype=np.float32)[None, :3]
    first = dec.prefill(embeds=x)
    buf = dec.kv["past_key_values.0.key"].buf
    dec.step(embeds=x[:, :1])
    dec.rewind(3)
    assert dec.kv_length == 3 and dec.kv["past_key_values.0.key"].buf is buf
    np.testing.assert_allclose(rc.to_host(buf)[0, 0, :3], x[0])
    dec.reset()
    np.testing.assert_allclose(dec.prefill(embeds=x), first)


# -- 6. builder packages: GroupQueryAttention, rotary and the hybrid's state on the device -----------------
# A one-token prompt keeps every product a GEMV (the simulator's tiled GEMM is slow), and the fp32 packages keep
# the simulator's run short; the int4 kernels are checked against the CPU in test_cuda_contrib.

PACKAGES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "packages")


@pytest.mark.parametrize("name,positions_up", [("llama_fp32", 0), ("qwen35_fp32", 3 * 8)])
def test_builder_package_decodes_on_the_device_moving_only_the_token(name, positions_up):
    """The CPU decoder's greedy tokens; per step only the token id (and, for the hybrid's rank-3 mrope
    positions, the 3 position ids the host builds) goes up and only the argmax comes down: the sequence lengths
    GroupQueryAttention validates are computed on the host from the mask and never cross."""
    spec = load_package(os.path.join(PACKAGES, name))
    pipe = Pipeline(spec, CUDA, max_length=8)
    assert isinstance(pipe.decoder, CudaDecoder)
    want = Pipeline(spec, CPU, max_length=8).generate([7], 3)
    with rc.TransferCounter() as tc:
        assert pipe.generate([7], 3) == want
    steps = pipe.decoder.transfers.steps
    assert len(steps) == 3
    for s in steps:
        assert (s["d2h"], s["d2h_calls"]) == (8, 1), s
        assert s["h2d"] == 8 + positions_up and s["h2d_calls"] == 1 + (positions_up > 0), s
    assert (tc.h2d, tc.d2h) == (sum(s["h2d"] for s in steps), sum(s["d2h"] for s in steps))
    assert not pipe.decoder.session.plan.round_trips
    assert all(rc.is_device_array(v) for v in pipe.decoder.state.values())
    # The caches are appended in place (shared max-length buffers): no step copies a cache row.
    for s in steps:
        assert s["launches"] == sum(s["kernels"].values())
        assert not {"device_decoder._copy_rows_kernel", "contrib_attention._kv_write"} & set(s["kernels"]), s


def test_shared_cache_buffers_are_appended_in_place_and_decode_as_copied_ones():
    """kv_share_buffer (the default) binds each whole max-length cache as past and GroupQueryAttention returns it
    as present: the tokens are those of copied caches (kv_share_buffer=False), which copy the live rows out and
    the new rows back every step, and the present is the very buffer the decoder holds."""
    from runtime import SessionOptions
    spec = load_package(os.path.join(PACKAGES, "llama_fp32"))
    shared = Pipeline(spec, CUDA, max_length=8)
    opts = SessionOptions()
    opts.kv_share_buffer = False
    copied = Pipeline(spec, CUDA, max_length=8, session_options=opts)
    assert shared.generate([7], 3) == copied.generate([7], 3)
    dec = shared.decoder
    for i, o in zip(dec.io.kv_inputs, dec.io.kv_outputs):  # the prompt and the first two tokens fed back
        assert rc.same_buffer(dec.kv[i].buf, dec.last_results[o]) and dec.kv[i].length == 3
    k_shared = [s["kernels"] for s in dec.transfers.steps]
    k_copied = [s["kernels"] for s in copied.decoder.transfers.steps]
    n_caches = len(dec.io.kv_inputs)
    for a, b in zip(k_shared[1:], k_copied[1:]):  # decode steps (the prefill has no live rows to copy out)
        assert "device_decoder._copy_rows_kernel" not in a and "contrib_attention._kv_write" not in a
        # one new row of the packed QKV: the attention kernel appends it (no separate launch)
        assert "contrib_attention._kv_append" not in a and a["contrib_attention._gqa_attn"] == n_caches // 2
        assert b["device_decoder._copy_rows_kernel"] == 2 * n_caches and "contrib_attention._kv_append" not in b
    live = rc.to_host(dec.kv[dec.io.kv_inputs[0]].buf)[:, :, :3]
    np.testing.assert_array_equal(live, rc.to_host(copied.decoder.kv[dec.io.kv_inputs[0]].live()))


def test_profile_native_reports_the_device_step(tmp_path, capsys):
    """``profile_native --ep cuda``: the native decoder on the device, and per decode step its launches (the
    llama fixture's 2 layers: per layer two norms, the QKV GEMV, attention (which appends the new cache row),
    the output GEMV, the fused gate GEMV and the down GEMV; then the embedding gather, the final norm, the logits
    GEMV and the argmax: 18), the token up and the argmax down, the weights a step reads, and the bandwidth figure (none on
    the simulator)."""
    import json
    from tools import profile_native
    out = tmp_path / "p.json"
    assert profile_native.main(["--model", os.path.join(PACKAGES, "llama_fp32"), "--ep", "cuda", "--backend",
                                "native", "--prompt-ids", "7", "--tokens", "3", "--runs", "1", "--warmups", "0",
                                "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "device: launches/step=18 h2d=8 B/step d2h=8 B/step" in text, text
    dev = json.loads(out.read_text())["results"]["native"]["device"]
    assert dev["launches_per_step"] == 18 and sum(dev["kernels_last_step"].values()) == 18
    assert dev["kernels_last_step"]["fused._gemv_gated"] == 2
    assert dev["weight_bytes"] > 0 and dev["kv_bytes_last_step"] > 0
    if rc.simulator():
        assert dev["device_copy_gb_s"] is None
    else:
        assert dev["device_copy_gb_s"] > 0


def test_bind_step_binds_the_next_step_without_advancing(toy_package):
    """``CudaDecoder.bind_step`` binds exactly what ``step`` would run: running the binding (twice) gives the
    step's logits and moves neither the length nor the state, so the same step then decodes as before."""
    a, _ = _decoders(toy_package, 1, max_length=8)
    b, _ = _decoders(toy_package, 1, max_length=8)
    for d in (a, b):
        d.prefill(tokens=[[1, 2]])
    want = a.step(tokens=[[3]])
    binding = b.bind_step(tokens=[[3]])
    li = b.output_names.index(b.io.logits_output)
    state = {k: v.copy() for k, v in b.state_to_host().items()}
    assert (b.transfers.bytes_in, b.transfers.calls) == (a.transfers.bytes_in - 8, 1)  # binding moved nothing
    for _ in range(2):
        b.session.run_with_iobinding(binding)
        np.testing.assert_array_equal(rc.to_host(binding.get_output_arrays()[li])[:, -1], want)
    assert b.kv_length == 2
    for k, v in b.state_to_host().items():
        np.testing.assert_array_equal(v, state[k])
    np.testing.assert_array_equal(b.step(tokens=[[3]]), want)
    assert b.kv_length == 3


def test_graph_probe_runs_a_bound_step_under_capture_and_names_what_needs_the_host(toy_package):
    """tools/cuda_graph_probe: two consecutive decode steps are compared launch by launch, and the bound decode
    step run again under a capturing block is stopped by the token
    id's upload inside the embedding Gather, and the probe names that node and copy (a CUDA graph holds device
    work only).  The launch chain runs eagerly on the simulator and, on a GPU, is replayed from a graph with the
    eager bits."""
    from tools import cuda_graph_probe as probe
    r = probe.step_probe(toy_package, prompt=[1, 2], reps=1)
    assert r["length"] == 5 and r["launches"] > 0 and (r["h2d_copies_eager"], r["d2h_copies_eager"]) == (1, 0), r
    # Two consecutive steps launch the same kernels; the toy's Concat caches grow, so its steps read per-run
    # buffers and lengths: every launch is accounted for as repeated or differing, and some differ.
    c = r["consecutive_steps"]
    assert c["launches"] > 0 and "kernel" not in c["differ"] and "missing" not in c["differ"]
    assert c["repeated"] + sum(sum(v.values()) for v in c["differ"].values()) == c["launches"]
    assert c["differ"].get("buffers") or c["differ"].get("buffers+values"), c
    assert r["captured"] == "capture failed"
    assert "Gather" in r["host_copies_in_step"] and "host-to-device copy of [1] int64" in r["host_copies_in_step"], r
    c = probe.chain_probe(8, 3, 1)
    assert c["launches"] == 3 and c["eager_us"] > 0
    if rc.simulator():
        assert c["captured"] == "not on the CUDA simulator"
    else:
        assert c["captured"] == "ok" and c["replay_matches_eager"], c


def test_lfm2_audio_speaks_with_the_decoder_on_the_device(tmp_path, ort_genai):
    """LFM2-Audio's spoken answer with its decoder on the device: the hidden state each frame is sampled from
    comes down, the frame's embedding goes in in place of its placeholder's; the tokens and codes are
    onnxruntime-genai's."""
    import pipeline as og
    from fixtures import lfm2_audio_package as A
    package, clip = A.build(str(tmp_path / "pkg")), A.wav(str(tmp_path / "a.wav"))

    def run(api, **where):
        model = api.Model(package, **where)
        inputs = model.create_multimodal_processor()("Hi <|audio|> there", audios=api.Audios.open(clip))
        params = api.GeneratorParams(model)
        params.set_search_options(max_length=inputs["input_ids"].as_numpy().shape[1] + 6, random_seed=1)
        generator = api.Generator(model, params)
        generator.set_inputs(inputs)
        while not generator.is_done():
            generator.generate_next_token()
        return model, generator.get_sequence(0).tolist(), np.asarray(generator.get_output("audio_codes"))

    _, want, want_codes = run(ort_genai)
    model, got, codes = run(og, native="decoder", device="cuda")
    assert isinstance(model.pipeline.decoder, CudaDecoder)
    assert len(want_codes) >= 2 and got == want
    np.testing.assert_array_equal(codes, want_codes)
