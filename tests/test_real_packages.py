"""Real-architecture packages from the onnxruntime-genai model builder (fixtures/packages).

The pipeline's onnxruntime backend must produce the same greedy tokens as
onnxruntime-genai's own generator on the same package and prompt, and the
fully native pipeline the same tokens as onnxruntime.
"""
import os

import pytest

from pipeline.backends import BackendChoice
from pipeline.kv_cache import CarriedKV, SharedKV
from pipeline.metadata import load_package
from pipeline.runner import Pipeline
from tools.parity_matrix import genai_tokens


HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "packages")
PACKAGES = ["llama_fp32", "qwen35_fp32", "llama_int4", "qwen35_int4"]
# Prompts avoid the pad id (3): onnxruntime-genai masks a trailing pad token of the prompt, a convention the
# pipeline does not copy.
PROMPTS = [[1, 45, 77, 12, 300, 9], [7, 5, 11]]


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("name", PACKAGES)
def test_onnxruntime_backend_matches_onnxruntime_genai(name, prompt):
    path = os.path.join(HERE, name)
    n = 20
    expected = genai_tokens(path, prompt, n)
    pipe = Pipeline(load_package(path), BackendChoice(set(), False, "cpu"))
    assert pipe.generate(prompt, n) == expected


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("name", PACKAGES)
def test_native_backend_matches_onnxruntime(name, prompt):
    """Fully native decoding (every contrib op on its own kernel) gives onnxruntime's tokens."""
    spec = load_package(os.path.join(HERE, name))
    n = 16
    native = Pipeline(spec, BackendChoice(set(), True, "cpu"))
    assert native.decoder.backend == "native"
    ref = Pipeline(spec, BackendChoice(set(), False, "cpu")).generate(prompt, n)
    assert native.generate(prompt, n) == ref


@pytest.mark.parametrize("name", ["qwen35_int4", "llama_fp32"])
def test_greedy_step_is_the_plain_step(name):
    """The pipeline's greedy loop, ``step(..., want="argmax")`` and ``greedy_step`` give the same tokens, and the
    cache bound holds on every path."""
    import numpy as np
    spec = load_package(os.path.join(HERE, name))
    prompt = PROMPTS[0]
    ids = Pipeline(spec, BackendChoice(set(), True, "cpu")).generate(prompt, 12)
    d = Pipeline(spec, BackendChoice(set(), True, "cpu"), max_length=len(prompt) + 2).decoder
    tok = int(d.prefill(tokens=np.array([prompt]), want="argmax")[0])
    assert tok == ids[0]
    tok = int(d.step(tokens=np.array([[tok]]), want="argmax")[0])
    tok = d.greedy_step(tok)
    assert tok == ids[2]
    with pytest.raises(ValueError, match="max_length"):
        d.greedy_step(tok)
    assert d.kv_length == len(prompt) + 2


@pytest.mark.parametrize("name", ["llama_int4", "qwen35_fp32"])
def test_shared_cache_buffers_decode_as_copied_ones(name, monkeypatch):
    """The native decoder's attention caches are buffers sized to what the request reaches (prompt plus new
    tokens), written in place (past and present share them): the same tokens as with copied caches
    (ONNX_NUMBA_KV_SHARE_BUFFER=0), and a rewind keeps working."""
    import numpy as np
    spec = load_package(os.path.join(HERE, name))
    prompt = PROMPTS[0]
    shared = Pipeline(spec, BackendChoice(set(), True, "cpu"))
    ids = shared.generate(prompt, 12)
    d = shared.decoder
    assert isinstance(d.cache, SharedKV) and d.cache.in_place and d.kv
    for r in d.kv.values():
        assert r.capacity == len(prompt) + 12 < shared.max_length
    monkeypatch.setenv("ONNX_NUMBA_KV_SHARE_BUFFER", "0")
    copied = Pipeline(spec, BackendChoice(set(), True, "cpu"))
    assert copied.generate(prompt, 12) == ids
    assert isinstance(copied.decoder.cache, CarriedKV)
    assert all(r.capacity == len(prompt) + 11 for r in copied.decoder.kv.values())
    if not d.io.state_pairs:  # a recurrent state cannot rewind
        d.reset()
        t0 = int(d.prefill(tokens=np.array([prompt]), want="argmax")[0])
        t1 = d.greedy_step(t0)
        t2 = d.greedy_step(t1)
        d.rewind(len(prompt) + 1)
        assert d.greedy_step(t1) == t2 == ids[2]


@pytest.mark.parametrize("name", ["llama_int4", "qwen35_int4"])
def test_native_logits_are_onnxruntimes_by_default(name, monkeypatch):
    """With the setting unset, an x86 host with AVX2 runs onnxruntime's arithmetic: the native decoder's logits
    after the prompt and after one more token equal onnxruntime's to the bit; elsewhere the default is the
    project's own order."""
    import numpy as np
    from ops import _simd
    from ops._common import mlas_order
    monkeypatch.delenv("ONNX_NUMBA_MLAS_ORDER", raising=False)  # (the suite runs the own order: conftest.py)
    assert mlas_order() == _simd.AVX2
    if not _simd.AVX2:
        return
    spec = load_package(os.path.join(HERE, name))
    nat = Pipeline(spec, BackendChoice(set(), True, "cpu")).decoder
    ref = Pipeline(spec, BackendChoice(set(), False, "cpu")).decoder
    assert nat.backend == "native" and ref.backend != "native"
    a, b = nat.prefill(tokens=np.array([PROMPTS[0]])), ref.prefill(tokens=np.array([PROMPTS[0]]))
    np.testing.assert_array_equal(a, b)
    t = np.array([[int(np.argmax(np.asarray(b).reshape(-1, np.asarray(b).shape[-1])[-1]))]])
    np.testing.assert_array_equal(nat.step(tokens=t), ref.step(tokens=t))


def test_level4_sensitivity_tool(capsys):
    """``tools.level4_sensitivity`` on the int4 llama: native equals onnxruntime on the real input of the first
    level-4 MatMulNBits, and the tool reports onnxruntime's own change for a one-ulp input change."""
    import re
    from tools import level4_sensitivity
    level4_sensitivity.main(["--model", os.path.join(HERE, "llama_int4")])
    out = capsys.readouterr().out
    vals = {k: float(v) for k, v in re.findall(r"^(.*?):\s+max\|diff\| (\S+)$", out, re.M)}
    assert set(vals) == {"ort(x) vs native(x)", "ort(x) vs ort(x + 1 ulp)", "exact change (float64)"}, out
    assert vals["ort(x) vs native(x)"] < 1e-5


def test_shared_cache_buffers_grow_past_the_reserved_reach_keeping_their_rows():
    """A request that runs past what it reserved grows the caches (live rows kept), up to max_length."""
    import numpy as np
    spec = load_package(os.path.join(HERE, "llama_fp32"))
    prompt = PROMPTS[0]
    ref = Pipeline(spec, BackendChoice(set(), True, "cpu")).generate(prompt, 10)
    pipe = Pipeline(spec, BackendChoice(set(), True, "cpu"))
    d = pipe.decoder
    d.reset()
    d.reserve(len(prompt) + 1)
    ids = [int(d.prefill(tokens=np.array([prompt]), want="argmax")[0])]
    assert d.kv and {r.capacity for r in d.kv.values()} == {len(prompt) + 1}
    for _ in range(9):
        ids.append(d.greedy_step(ids[-1]))
    assert ids == ref
    rows = len(prompt) + 1
    while rows < len(prompt) + 9:  # doubled whenever full
        rows *= 2
    assert {r.capacity for r in d.kv.values()} == {rows}


def test_a_prompt_longer_than_the_first_cache_size_still_writes_in_place(monkeypatch):
    """Without a reserved reach, the shared caches start at ``KV_START_ROWS`` rows or the prompt, whichever is
    larger, so a long prompt does not drop the decoder to copied caches."""
    import numpy as np
    import pipeline.kv_cache as K
    monkeypatch.setattr(K, "KV_START_ROWS", 2)
    spec = load_package(os.path.join(HERE, "llama_fp32"))
    prompt = PROMPTS[0]
    d = Pipeline(spec, BackendChoice(set(), True, "cpu")).decoder
    d.reset()
    tok = int(d.prefill(tokens=np.array([prompt]), want="argmax")[0])
    d.greedy_step(tok)
    assert d.cache.in_place
    assert {r.capacity for r in d.kv.values()} == {2 * len(prompt)}


@pytest.mark.parametrize("native", ["none", "all"])
@pytest.mark.parametrize("beams", [1, 2])
def test_a_padded_batch_on_a_recurrent_decoder_decodes_each_row_as_alone(native, beams):
    """qwen3.5's linear-attention layers carry state the graphs do not mask: the batch's first run takes each row
    alone, so no pad reaches a row's state, and each row's tokens are its tokens alone (given the same number of
    new tokens: beam search's pick depends on how far it may go).  onnxruntime-genai runs the pads through the
    state, so its rows are not their own; this compares with the pipeline's own single rows."""
    import numpy as np
    import pipeline as og
    path = os.path.join(HERE, "qwen35_fp32")
    model = og.Model(path, native=native)
    prompts, width, limit = [[5, 7, 9, 11], [13, 17], [19, 23, 29]], 4, 11

    def run(rows, max_length):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=max_length, batch_size=len(rows), num_beams=beams)
        g = og.Generator(model, params)
        g.append_tokens(np.array([r + [3] * (max(map(len, rows)) - len(r)) for r in rows], np.int32))
        while not g.is_done():
            g.generate_next_token()
        return [g.get_sequence(i).tolist() for i in range(len(rows))]
    batch = run(prompts, limit)
    for row, prompt in zip(batch, prompts):
        assert row[:len(prompt)] + row[width:] == run([prompt], limit - width + len(prompt))[0]
