"""LFM2-Audio packages (``type`` ``lfm2_audio``, fixture ``fixtures/lfm2_audio_package.py``): the processor's outputs
(the clips' normalised log-mel, their placeholders at each ``<|audio|>``), the speech model run per clip, and the
spoken answer (each frame's codes from the depthformer, the frame fed back, its placeholder in the sequence) equal
onnxruntime-genai's, natively and on onnxruntime, greedy and sampled with a seed, plain and interleaved."""
import json
import os
import shutil

import numpy as np
import pytest

import pipeline as og
from fixtures import lfm2_audio_package as L
from pipeline.lfm2_audio import MT19937, discrete_draw, to_half

# the mel differs from onnxruntime-genai's by its FFT (double precision here, single there): bound fixed beforehand
MEL_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return L.build(str(tmp_path_factory.mktemp("lfm2_audio")))


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("clips")
    return [L.wav(str(d / "a.wav"), 0.3, seed=0), L.wav(str(d / "b.wav"), 0.5, seed=1),
            L.wav(str(d / "c.wav"), 0.25, 44100, seed=2, channels=2), L.wav(str(d / "short.wav"), 0.01, seed=3)]


# prompt, which clips: one clip; two (the speech model runs once per clip); text only; a 44.1 kHz stereo clip;
# a marker without a clip; a clip too short for two mel frames
CASES = [("Hi <|audio|> there", [0]), ("<|audio|> and <|audio|>", [0, 1]), ("hello", []), ("<|audio|>", [2]),
         ("<|audio|> and <|audio|>", [0]), ("<|audio|>", [3])]
# greedy codes; sampled (onnxruntime-genai's defaults: temperature 1, the 4 best); interleaved; all codes, cooler
OPTIONS = [{"audio_temperature": 0.0}, {"random_seed": 1}, {"random_seed": 2, "audio_interleaved": True},
           {"random_seed": 3, "audio_top_k": 0, "audio_temperature": 0.7}]


def _runs(api, path, clips, options, native=None, new_tokens=30):
    """Per case: ``(inputs, sequence, audio codes, the logits before each step)``, or ``("error", message)``."""
    model = api.Model(path) if native is None else api.Model(path, native=native)
    processor = model.create_multimodal_processor()
    out = []
    for prompt, which in CASES:
        try:
            inputs = processor(prompt, audios=api.Audios.open(*[clips[k] for k in which]) if which else None)
        except RuntimeError as e:
            out.append(("error", str(e)))
            continue
        arrays = {k: np.array(inputs[k].as_numpy()) for k in inputs.keys()}
        params = api.GeneratorParams(model)
        params.set_search_options(max_length=arrays["input_ids"].shape[1] + new_tokens, **options)
        generator = api.Generator(model, params)
        generator.set_inputs(inputs)
        logits = []
        while not generator.is_done():
            logits.append(np.array(generator.get_logits()))
            generator.generate_next_token()
        try:
            codes = np.asarray(generator.get_output("audio_codes"))
        except RuntimeError:  # a package without speech output has none
            codes = None
        out.append((arrays, generator.get_sequence(0).tolist(), codes, np.concatenate(logits)))
    return out


def _assert_same(got, want):
    for case, g, w in zip(CASES, got, want):
        if w[0] == "error" or g[0] == "error":
            assert g == w, case
            continue
        assert sorted(g[0]) == sorted(w[0]), case
        for k, a in w[0].items():
            b = g[0][k]
            assert b.dtype == a.dtype and b.shape == a.shape, (case, k)
            if k == "audio_embeds":
                np.testing.assert_allclose(b, a, rtol=0, atol=MEL_TOLERANCE, err_msg=str(case))
            else:
                np.testing.assert_array_equal(b, a, err_msg=f"{case}: {k}")
        assert g[1] == w[1], case
        if w[2] is None or g[2] is None:
            assert g[2] is w[2], case
        else:
            assert g[2].dtype == w[2].dtype and g[2].shape == w[2].shape, case
            np.testing.assert_array_equal(g[2], w[2], err_msg=str(case))
        np.testing.assert_allclose(g[3], w[3], rtol=1e-4, atol=1e-4, err_msg=str(case))


@pytest.fixture(scope="module")
def reference(package, clips, ort_genai):
    return [_runs(ort_genai, package, clips, o) for o in OPTIONS]


@pytest.mark.parametrize("native", ["all", "none"])
@pytest.mark.parametrize("k", range(len(OPTIONS)))
def test_inputs_tokens_and_codes_are_onnxruntime_genai_s(package, clips, reference, native, k):
    _assert_same(_runs(og, package, clips, OPTIONS[k], native), reference[k])


def test_the_cases_reach_what_they_pin(reference):
    """The reference runs cover what the loop must get right: clips of 4 and 7 placeholders, speech started by
    the start token, a frame ending the speech (a placeholder with no codes), text again after it, interleaved
    switching, and the two errors."""
    greedy, _, interleaved, _ = reference
    inputs, seq, codes, logits = greedy[0]
    assert inputs["audio_sizes"].tolist() == [4] and inputs["audio_embeds"].shape == (1, 31, L.MELS)
    assert greedy[1][0]["audio_sizes"].tolist() == [4, 7] and greedy[1][0]["audio_lengths"].tolist() == [31, 51]
    new = seq[inputs["input_ids"].shape[1]:]
    assert new[2] == 439 and new[3:].count(L.AUDIO) == len(codes) + 1  # one frame ended the speech
    assert 439 in new[new.index(472):] and codes.shape[1] == L.CODEBOOKS
    assert (logits[3, 0] == 0).sum() == 1 and logits[3, 0, L.AUDIO] == 0  # the placeholder's logits
    assert L.AUDIO not in greedy[2][1] and greedy[2][0]["audio_sizes"].tolist() == [0]
    first = interleaved[2][1][len(interleaved[2][0]["input_ids"][0]):]
    assert first[:3] != [L.AUDIO] * 3 and first[3:7] == [L.AUDIO] * 4  # 3 text positions, then 4 frames
    assert [r[0] for r in greedy[4:]] == ["error", "error"]


def _variant(package, tmp_path, edit) -> str:
    d = str(tmp_path / "variant")
    shutil.copytree(package, d)
    path = os.path.join(d, "genai_config.json")
    with open(path) as fh:
        cfg = json.load(fh)
    edit(cfg["model"])
    with open(path, "w") as fh:
        json.dump(cfg, fh)
    return d


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return L.build(str(tmp_path_factory.mktemp("lfm2_audio_hybrid")), hybrid=True)


@pytest.mark.parametrize("native", ["all", "none"])
def test_a_hybrid_decoder_as_the_published_ones(hybrid, clips, ort_genai, native):
    """A decoder with an LFM2 convolution state (as the published decoders have, ``layer_types``): the frames fed
    back go through the state too; greedy and interleaved runs equal onnxruntime-genai's."""
    model = og.Model(hybrid, native=native)
    assert [p.input for p in model.spec.decoder.io.state_pairs] == ["past.1.conv"]
    for options in (OPTIONS[0], OPTIONS[2]):
        want = _runs(ort_genai, hybrid, clips, options)
        assert any(w[0] != "error" and len(w[2]) for w in want)
        _assert_same(_runs(og, hybrid, clips, options, native), want)


def test_the_hidden_states_output_by_its_default_name(package, clips, tmp_path, ort_genai):
    """Without ``model.decoder.outputs.hidden_states`` the depthformer reads the decoder's ``hidden_states``."""
    path = _variant(package, tmp_path, lambda m: m["decoder"]["outputs"].pop("hidden_states"))
    opts = {"audio_temperature": 0.0}
    want = _runs(ort_genai, path, clips, opts)[:2]
    assert len(want[0][2])
    for g, w in zip(_runs(og, path, clips, opts, "all")[:2], want):
        assert g[1] == w[1]
        np.testing.assert_array_equal(g[2], w[2])


def test_text_end_leaves_the_turn_to_speech(package, clips, tmp_path, ort_genai):
    """Interleaved, once the text-end token came the rest of the turn is speech (here the token is one the
    fixture's decoder produces)."""
    path = _variant(package, tmp_path, lambda m: m["audio_output"].update(text_end_token_id=114))
    opts = {"random_seed": 2, "audio_interleaved": True}
    want = _runs(ort_genai, path, clips, opts)[:3]
    assert 114 in want[0][1]
    for native in ("all", "none"):
        got = _runs(og, path, clips, opts, native)[:3]
        for g, w in zip(got, want):
            assert g[1] == w[1]
            np.testing.assert_array_equal(g[2], w[2])


@pytest.mark.parametrize("native", ["all", "none"])
def test_a_second_turn_starts_in_text(package, clips, native):
    """Ids appended mid-speech start a new turn in text: the next logits are the decoder's own, not the
    placeholder's, and the frames so far are kept.  (onnxruntime-genai 0.18 cannot append to a multimodal
    sequence after generating: its next decoder run fails on the cache's shape.)"""
    model = og.Model(package, native=native)
    inputs = model.create_multimodal_processor()("Hi <|audio|> there", audios=og.Audios.open(clips[0]))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=80, audio_temperature=0.0)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    for _ in range(8):
        generator.generate_next_token()
    assert generator.get_sequence(0).tolist()[-1] == L.AUDIO and (generator.get_logits() == 0).sum() == 1
    frames = np.asarray(generator.get_output("audio_codes"))
    generator.append_tokens(np.array([5, 9], np.int32))
    logits = generator.get_logits()
    assert logits.min() > np.finfo(np.float32).min and int(np.argmax(logits)) != L.AUDIO
    generator.generate_next_token()
    np.testing.assert_array_equal(np.asarray(generator.get_output("audio_codes")), frames)


def _error(api, path, clips, prompt="Hi <|audio|> there", which=(0,), **options):
    try:
        model = api.Model(path)
        inputs = model.create_multimodal_processor()(prompt, audios=api.Audios.open(*[clips[k] for k in which]))
        params = api.GeneratorParams(model)
        params.set_search_options(max_length=60, **options)
        generator = api.Generator(model, params)
        generator.set_inputs(inputs)
        generator.generate_next_token()
    except (RuntimeError, ValueError) as e:  # a config error is a MetadataError (a ValueError) here
        return str(e)
    return None


@pytest.mark.parametrize("what", ["batch", "beams", "eos", "no_depthformer", "placeholder", "prompts",
                                  "beams_without_speech_output"])
def test_errors_are_onnxruntime_genai_s(package, clips, tmp_path, ort_genai, what):
    path, options, prompt = package, {}, "Hi <|audio|> there"
    if what == "batch":
        options = {"batch_size": 2}
    elif what == "beams":
        options = {"num_beams": 2}
    elif what == "eos":
        path = _variant(package, tmp_path, lambda m: m.update(eos_token_id=[2, 439]))
    elif what == "no_depthformer":
        path = _variant(package, tmp_path, lambda m: m["audio_output"].pop("depthformer"))
    elif what == "placeholder":
        path = _variant(package, tmp_path, lambda m: m.update(audio_token_id=600))
    elif what == "prompts":
        prompt = ["Hi <|audio|> there", "two"]
    else:
        path, options = L.build(str(tmp_path / "text"), speech_output=False), {"num_beams": 2}
    want = _error(ort_genai, path, clips, prompt, **options)
    assert want is not None
    assert _error(og, path, clips, prompt, **options) == want


def test_without_speech_output(clips, tmp_path, ort_genai):
    """A package without ``audio_output`` answers in text (the speech model still runs per clip) and has no
    ``audio_codes``."""
    path = L.build(str(tmp_path / "text"), speech_output=False)
    want = _runs(ort_genai, path, clips, {})
    assert want[1][2] is None and L.AUDIO not in want[1][1][len(want[1][0]["input_ids"][0]):]
    _assert_same(_runs(og, path, clips, {}, "all"), want)


def test_mt19937_and_discrete_distribution():
    """The generator is the C++ standard's (its 10000th output from the default seed is fixed by the standard);
    the draw walks libstdc++'s running sums: with weights 1, 1, 2 a canonical value below 0.25 picks 0, below 0.5
    picks 1, else 2."""
    rng = MT19937(5489)
    for _ in range(9999):
        rng()
    assert rng() == 4123659995

    class Fixed:
        def __init__(self, value):
            self.value = value

        def canonical(self):
            return self.value
    assert [discrete_draw([1, 1, 2], Fixed(u)) for u in (0.0, 0.2499, 0.25, 0.3, 0.5, 0.51, 0.999)] == \
        [0, 0, 0, 1, 1, 2, 2]
    assert discrete_draw([3.0], Fixed(0.9)) == 0


def test_the_command_line_writes_the_codes(package, clips, tmp_path, ort_genai, capsys):
    """``generate --audio ... --audio-codes FILE --audio-interleaved --seed N``: the tokens and the saved codes are
    onnxruntime-genai's for the same options."""
    from pipeline.__main__ import main
    prompt, out = "Hi <|audio|> there", str(tmp_path / "codes.npy")
    assert main(["generate", package, "--prompt", prompt, "--audio", clips[0], "--max-new-tokens", "12",
                 "--audio-codes", out, "--audio-interleaved", "--seed", "2", "--native", "none"]) == 0
    printed = capsys.readouterr().out.splitlines()
    model = ort_genai.Model(package)
    inputs = model.create_multimodal_processor()(prompt, audios=ort_genai.Audios.open(clips[0]))
    n = inputs["input_ids"].as_numpy().shape[1]
    params = ort_genai.GeneratorParams(model)
    params.set_search_options(max_length=n + 12, audio_interleaved=True, random_seed=2)
    generator = ort_genai.Generator(model, params)
    generator.set_inputs(inputs)
    while not generator.is_done():
        generator.generate_next_token()
    assert printed[-2] == f"token_ids: {generator.get_sequence(0)[n:].tolist()}"
    want = np.asarray(generator.get_output("audio_codes"))
    assert printed[-1] == f"audio codes: {len(want)} frames -> {out}" and len(want)
    np.testing.assert_array_equal(np.load(out), want)


def test_a_frame_for_a_float16_decoder_is_rounded_as_onnxruntime_genai_rounds():
    """``to_half`` is onnxruntime-genai's float32-to-float16 conversion: numpy's rounding except at an exact tie,
    which goes away from zero (not to even), and overflow saturated to the all-ones pattern."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(4096) * np.exp(rng.uniform(-12, 8, 4096))).astype(np.float32)
    ties = ((x.view(np.uint32) & 0x1FFF) == 0x1000)
    np.testing.assert_array_equal(to_half(x[~ties]), x[~ties].astype(np.float16))
    tie = np.array([1 + 2 ** -11, -(1 + 2 ** -11), 2.5 * 2 ** -24], np.float32)  # the last: a subnormal tie
    assert to_half(tie).tolist() == [1 + 2 ** -10, -(1 + 2 ** -10), 3 * 2 ** -24]
    assert tie.astype(np.float16).tolist() == [1.0, -1.0, 2 * 2 ** -24]
    assert to_half(np.array([1e6, -1e6], np.float32)).view(np.uint16).tolist() == [0x7FFF, 0xFFFF]
