"""Phi-4-multimodal's audio features (``AudioDecoderEx`` -> ``Phi4AudioEmbed`` and ``phi4_audio_stack`` in
``pipeline/audio.py``), run over the fixture package's ``audio_feature_extraction.json``
(``fixtures/phi4mm_package.py``), against onnxruntime-genai's own ``phi4mm`` processor in the same test.

Tolerances, fixed before comparing: ``audio_sizes`` and ``audio_attention_mask`` equal (values, shapes, types);
``audio_embeds`` within 1e-4 absolute (float32 FFTs of different libraries before a log, as for Whisper's
features).  The steps reproduce dlib's float32 FFT, ``logf`` and the float32 mel product in their order, and every
clip here came out bit-equal; the tolerance stays the one fixed beforehand."""
import json
import os

import numpy as np
import pytest

from fixtures import phi4mm_package as P4
from fixtures.whisper_package import clip
from pipeline.audio import AUDIO_STEPS, decode_audio_ex, phi4_audio_embed, phi4_audio_stack
from pipeline.spec import RequestError

NAMES = ("audio_embeds", "audio_attention_mask", "audio_sizes")
# name: (rate, seconds or samples, channels); each decodes to 16 kHz or 8 kHz as the comment says
CLIPS = {"mono16k": (16000, 1.3, 1),      # 16 kHz as it is
         "mono8k": (8000, 1.1, 1),        # 8 kHz as it is: the 8k STFT (256 / 200 / 80), top bins dropped
         "stereo44k": (44100, 0.9, 2),    # mixed, filtered and resampled to 16 kHz
         "mono22k": (22050, 0.8, 1),      # to 16 kHz
         "mono11k": (11025, 0.7, 1),      # to 8 kHz (the highest target rate at or below 11025)
         "one_frame": (16000, 400, 1),    # exactly one 400-sample frame
         "long": (16000, 30.5, 1),        # cut to its first 480000 samples (30 s): 2998 frames
         "low": (6000, 0.5, 1),           # below both target rates: refused
         "short": (16000, 300, 1),        # less than one frame: refused here (onnxruntime-genai reads past it)
         "empty": (16000, 0, 1)}


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return P4.build(str(tmp_path_factory.mktemp("phi4mm")))


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("clips")
    return {name: clip(str(d / f"{name}.wav"), *spec, seed) for seed, (name, spec) in enumerate(CLIPS.items())}


@pytest.fixture(scope="module")
def steps(package):
    with open(os.path.join(package, "audio_feature_extraction.json"), encoding="utf-8") as fh:
        doc = json.load(fh)
    return [(AUDIO_STEPS[s["operation"]["type"]], s["operation"].get("attrs") or {})
            for s in doc["feature_extraction"]["sequence"]]


@pytest.fixture(scope="module")
def processor(package, ort_genai):
    return ort_genai.Model(package).create_multimodal_processor()


def _ours(steps, paths):
    """The chain run per clip (as ``MultiModalProcessor._run_steps`` runs it), then ``phi4_audio_stack``."""
    results = []
    for path in paths:
        with open(path, "rb") as fh:
            value = fh.read()
        for fn, attrs in steps:
            value = fn(value, **attrs)
        results.append(value)
    return dict(zip(NAMES, phi4_audio_stack(results)))


def _theirs(api, processor, paths):
    tags = "".join(f"<|audio_{i + 1}|>" for i in range(len(paths)))
    out = processor(tags + "hi", audios=api.Audios.open(*paths))
    return {k: np.asarray(out[k].as_numpy()) for k in NAMES}


def _assert_close(got, ref):
    for k in NAMES:
        assert got[k].shape == ref[k].shape and got[k].dtype == ref[k].dtype, \
            (k, got[k].shape, got[k].dtype, ref[k].shape, ref[k].dtype)
    assert np.array_equal(got["audio_sizes"], ref["audio_sizes"]), (got["audio_sizes"], ref["audio_sizes"])
    assert np.array_equal(got["audio_attention_mask"], ref["audio_attention_mask"])
    np.testing.assert_allclose(got["audio_embeds"], ref["audio_embeds"], rtol=0, atol=1e-4)


@pytest.mark.parametrize("name,rate", [("mono16k", 16000), ("mono8k", 8000), ("stereo44k", 16000),
                                       ("mono22k", 16000), ("mono11k", 8000), ("one_frame", 16000),
                                       ("long", 16000)])
def test_each_clip_as_onnxruntime_genai_processes_it(clips, steps, processor, ort_genai, name, rate):
    with open(clips[name], "rb") as fh:
        assert decode_audio_ex(fh.read(), **steps[0][1])[1] == rate
    got, ref = _ours(steps, [clips[name]]), _theirs(ort_genai, processor, [clips[name]])
    _assert_close(got, ref)
    frames = got["audio_embeds"].shape[1]
    assert got["audio_attention_mask"].all() and got["audio_sizes"].tolist() == [-(-frames // 8)]


def test_clips_of_different_lengths_and_rates_are_stacked_as_onnxruntime_genai_stacks_them(
        clips, steps, processor, ort_genai):
    paths = [clips[n] for n in ("mono8k", "mono16k", "one_frame")]
    got, ref = _ours(steps, paths), _theirs(ort_genai, processor, paths)
    _assert_close(got, ref)
    lengths = got["audio_attention_mask"].sum(1)
    assert lengths.tolist() == [108, 128, 1]  # padded with zeros (features) and false (mask) to the longest
    for i, n in enumerate(lengths):
        assert not got["audio_embeds"][i, n:].any()


def test_what_the_audio_steps_refuse(clips, steps, processor, ort_genai):
    decode, embed = steps[0][1], steps[1][1]
    with pytest.raises(RuntimeError, match="only down-sampling supported"):  # onnxruntime-genai's words
        _theirs(ort_genai, processor, [clips["low"]])
    with open(clips["low"], "rb") as fh:
        with pytest.raises(RequestError, match="only down-sampling supported.*6000 is below 8000"):
            decode_audio_ex(fh.read(), **decode)
    for name, words in (("short", "too short: 300 samples at 16000 Hz"), ("empty", "empty")):
        with open(clips[name], "rb") as fh:
            value = decode_audio_ex(fh.read(), **decode)
        with pytest.raises(RequestError, match=words):
            phi4_audio_embed(value, **embed)
    with pytest.raises(RequestError, match="Only 8k and 16k Hz"):
        phi4_audio_embed((np.zeros((1, 4000), np.float32), 22050), **embed)
    with pytest.raises(RequestError, match=r"unknown attribute\(s\) \['stft_normal/n_ff', 'window'\]"):
        phi4_audio_embed((np.zeros((1, 4000), np.float32), 16000), **embed, window=1, **{"stft_normal/n_ff": 5})
    with pytest.raises(RequestError, match=r"unknown attribute\(s\) \['target_rate'\]"):
        decode_audio_ex(b"", target_rate=16000)
    with pytest.raises(RequestError, match="win_fn must be hann or hamming"):
        phi4_audio_embed((np.zeros((1, 4000), np.float32), 16000), **dict(embed, **{"stft_normal/win_fn": "kaiser"}))
