"""Gemma 4's audio features (``AudioDecoder`` -> ``Gemma4LogMel`` and ``gemma4_audio_sizes`` in
``pipeline/audio.py``), run over the fixture package's ``audio_feature_extraction.json``
(``fixtures/gemma4_package.py``), against onnxruntime-genai's own ``gemma4`` processor in the same test.

Tolerances, fixed before comparing: ``audio_sizes`` and ``audio_attention_mask`` equal (values, shapes, types);
``audio_embeds`` within 1e-4 absolute (the project's tolerance for audio features).  Every clip and setting tried
came out bit-equal, so the features are asserted equal too (``assert_array_equal`` after the 1e-4 check, which
reports the size of any drift first).

onnxruntime-genai 0.18 dies with a floating-point exception (it takes the process down) on a clip of fewer than
161 samples at 16 kHz (no 321-sample frame); those clips are only checked to be refused here, never given to it."""
import copy
import json
import os
import shutil

import numpy as np
import pytest

from fixtures import gemma4_package as G4
from fixtures.whisper_package import clip
from pipeline.audio import AUDIO_STEPS, decode_audio, gemma4_audio_sizes, gemma4_log_mel
from pipeline.spec import RequestError

# name: (rate, seconds or samples, channels)
CLIPS = {"mono16k": (16000, 1.3, 1),       # 129 frames
         "one_frame": (16000, 161, 1),     # the fewest samples giving a frame (161 + 160 padding = 321)
         "frame_320": (16000, 320, 1),     # still one frame
         "frame_321": (16000, 321, 1),     # two
         "sec_16160": (16000, 16160, 1),   # 100 frames, 25 tokens
         "sec_16161": (16000, 16161, 1),   # 101 frames, 26 tokens
         "stereo44k": (44100, 0.9, 2),     # mixed, filtered and resampled to 16 kHz
         "silence": (16000, 1.0, 1),       # log(0 + mel_floor) everywhere
         "long": (16000, 30.5, 1)}         # cut to its first 480000 samples: 2999 frames
REFUSED = {"mono8k": (8000, 0.5, 1),       # AudioDecoder only brings rates down (both refuse)
           "short": (16000, 160, 1)}       # no frame: refused here (onnxruntime-genai dies on it)


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return G4.build(str(tmp_path_factory.mktemp("gemma4")))


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma4_clips")
    return {name: clip(str(d / f"{name}.wav"), *spec, seed=i, silence=name == "silence")
            for i, (name, spec) in enumerate({**CLIPS, **REFUSED}.items())}


def _sequence(package):
    with open(os.path.join(package, "audio_feature_extraction.json"), encoding="utf-8") as fh:
        return [(s["operation"]["type"], s["operation"].get("attrs") or {})
                for s in json.load(fh)["feature_extraction"]["sequence"]]


def _ours(package, path):
    """The package's steps through ``AUDIO_STEPS``, then the processor's batch of one and ``audio_sizes``."""
    with open(path, "rb") as fh:
        value = fh.read()
    for kind, attrs in _sequence(package):
        value = AUDIO_STEPS[kind](value, **attrs)
    embeds, mask = value
    return {"audio_embeds": embeds[None], "audio_attention_mask": mask[None],
            "audio_sizes": np.array([gemma4_audio_sizes(embeds.shape[0])], np.int64)}


def _theirs(og, package, path):
    processor = og.Model(package).create_multimodal_processor()
    out = processor("<|audio|>say", audios=og.Audios.open(path))
    return {k: out[k].as_numpy() for k in ("audio_embeds", "audio_attention_mask", "audio_sizes")}


def _check(ours, theirs):
    for k in ("audio_sizes", "audio_attention_mask"):
        assert ours[k].dtype == theirs[k].dtype and ours[k].shape == theirs[k].shape, k
        np.testing.assert_array_equal(ours[k], theirs[k], err_msg=k)
    a, b = ours["audio_embeds"], theirs["audio_embeds"]
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
    np.testing.assert_array_equal(a, b)


def test_fixture_config(package):
    assert [k for k, _ in _sequence(package)] == ["AudioDecoder", "Gemma4LogMel"]
    assert AUDIO_STEPS["Gemma4LogMel"] is gemma4_log_mel


@pytest.mark.parametrize("name", list(CLIPS))
def test_clip_matches_onnxruntime_genai(package, clips, ort_genai, name):
    ours, theirs = _ours(package, clips[name]), _theirs(ort_genai, package, clips[name])
    _check(ours, theirs)
    frames = ours["audio_embeds"].shape[1]
    assert frames == {"one_frame": 1, "frame_320": 1, "frame_321": 2, "sec_16160": 100, "sec_16161": 101,
                      "long": 2999}.get(name, frames)
    assert ours["audio_attention_mask"].all()


def test_refused_clips(package, clips, ort_genai):
    with pytest.raises(RequestError, match="only down-sampling"):
        _ours(package, clips["mono8k"])
    with pytest.raises(Exception, match="only down-sampling"):
        _theirs(ort_genai, package, clips["mono8k"])
    with pytest.raises(RequestError, match="too short"):
        _ours(package, clips["short"])


def test_non_default_settings(package, clips, ort_genai, tmp_path):
    """Pre-emphasis (both flavours), a doubled FFT, another bank and per-bin normalization, each against
    onnxruntime-genai run on a copy of the package with that ``audio_feature_extraction.json``."""
    rng = np.random.default_rng(7)
    settings = [{"preemphasis": 0.97, "preemphasis_htk_flavor": 1},
                {"preemphasis": 0.97, "preemphasis_htk_flavor": 0, "fft_overdrive": 1},
                {"feature_size": 80, "min_frequency": 20.0, "max_frequency": 7600.0, "mel_floor": 1e-5,
                 "frame_length_ms": 25.0, "hop_length_ms": 12.5},
                {"per_bin_mean": [float(v) for v in rng.standard_normal(128)],
                 "per_bin_stddev": [0.0] + [float(v) for v in rng.uniform(0.1, 2.0, 127)]}]
    with open(os.path.join(package, "audio_feature_extraction.json"), encoding="utf-8") as fh:
        config = json.load(fh)
    for i, setting in enumerate(settings):
        copy_dir = str(tmp_path / f"pkg{i}")
        shutil.copytree(package, copy_dir)
        c = copy.deepcopy(config)
        c["feature_extraction"]["sequence"][1]["operation"]["attrs"].update(setting)
        with open(os.path.join(copy_dir, "audio_feature_extraction.json"), "w", encoding="utf-8") as fh:
            json.dump(c, fh)
        _check(_ours(copy_dir, clips["mono16k"]), _theirs(ort_genai, copy_dir, clips["mono16k"]))


def test_attribute_errors(package, clips, ort_genai, tmp_path):
    """Unknown attributes and JSON types onnxruntime-extensions does not read are refused, as there."""
    pcm = decode_audio(open(clips["mono16k"], "rb").read())
    attrs = _sequence(package)[1][1]
    for bad, what in (({"bogus": 1}, "bogus"), ({"frame_length_ms": 20}, "frame_length_ms"),
                      ({"feature_size": 128.0}, "feature_size"), ({"per_bin_mean": [1] * 128}, "per_bin_mean"),
                      ({"per_bin_stddev": [1.0] * 5}, "per_bin_stddev"), ({"hop_length_ms": 0.0}, "hop")):
        with pytest.raises(RequestError, match=what):
            gemma4_log_mel(pcm, **{**attrs, **bad})
    copy_dir = str(tmp_path / "bad")
    shutil.copytree(package, copy_dir)
    with open(os.path.join(package, "audio_feature_extraction.json"), encoding="utf-8") as fh:
        c = json.load(fh)
    c["feature_extraction"]["sequence"][1]["operation"]["attrs"]["bogus"] = 1
    with open(os.path.join(copy_dir, "audio_feature_extraction.json"), "w", encoding="utf-8") as fh:
        json.dump(c, fh)
    with pytest.raises(Exception, match="unknown attribute 'bogus'"):
        ort_genai.Model(copy_dir).create_multimodal_processor()


def test_audio_sizes():
    assert [gemma4_audio_sizes(t) for t in (1, 2, 3, 4, 5, 99, 100, 101, 129, 2999)] == \
        [1, 1, 1, 1, 2, 25, 25, 26, 33, 750]
