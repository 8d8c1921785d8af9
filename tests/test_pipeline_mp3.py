"""MP3 decoding (``pipeline/mp3.py``, reached through ``AudioDecoder`` in ``pipeline/audio.py``) against
onnxruntime-genai, whose onnxruntime-extensions decodes MP3 with dr_mp3.

onnxruntime-genai hands out no decoded samples, so each clip goes through a processor whose features this project
reproduces bit for bit from the same samples: Gemma 4's (``AudioDecoder`` -> ``Gemma4LogMel``) for clips at 16 kHz
and above (the higher rates low-passed and resampled to 16 kHz), Phi-4-multimodal's (``AudioDecoderEx`` ->
``Phi4AudioEmbed``) for the 8 and 11.025 kHz ones (its 8 kHz path: as decoded, and resampled).  No tolerance: the
features must be equal (``assert_array_equal``), which a one-ulp change of the decoder's output breaks.

The clips are written here by libsndfile's LAME encoder from seeded signals (a sine pair, a chirp and noise): mono
and stereo (joint stereo: mid/side), MPEG-1, MPEG-2 and MPEG-2.5 rates, variable and constant bitrate, from under
one frame to a few seconds, each opening with the Xing/Info tag frame LAME writes; plus full-scale noise (large
values: the escape tables), clicks (short blocks), clips whose joint-stereo headers are set to intensity stereo or
whose short blocks are flagged mixed (LAME writes neither; both decoders then read the same bytes that way), a
trailing ID3v1 tag and a cut last frame (resynchronisation), a rate change and a channel change mid-stream (dr_mp3's
own handling).  Mixed blocks at 8 kHz are left out: dr_mp3 reads gains there that no granule computed (see
``pipeline/mp3.py``); that clip is only decoded, in the damaged-stream test."""
import io
import json
import os

import numpy as np
import pytest

from fixtures import gemma4_package as G4
from fixtures import phi4mm_package as P4
from pipeline.audio import AUDIO_STEPS, decode_audio
from pipeline.mp3 import MP3DecodeError, decode_mp3

# name: (rate, seconds or samples, channels, soundfile.write options)
VBR, CBR = {}, {"bitrate_mode": "CONSTANT", "compression_level": 0.5}
SOURCES = {"mono16k": (16000, 1.0, 1, VBR),        # MPEG-2, mono
           "stereo16k": (16000, 0.8, 2, CBR),      # MPEG-2, joint stereo
           "stereo44k": (44100, 1.0, 2, VBR),      # MPEG-1, resampled to 16 kHz
           "mono48k": (48000, 0.6, 1, CBR),
           "stereo32k": (32000, 0.6, 2, VBR),
           "stereo22k": (22050, 0.7, 2, CBR),      # MPEG-2
           "mono24k": (24000, 0.6, 1, VBR),
           "short16k": (16000, 300, 1, VBR),       # under one frame of audio: tag frame plus two
           "mono8k": (8000, 1.2, 1, VBR),          # MPEG-2.5, Phi-4's 8 kHz path as decoded
           "stereo11k": (11025, 1.0, 2, CBR),      # MPEG-2.5, resampled to 8 kHz
           "mono44k": (44100, 0.5, 1, VBR)}
GEMMA4 = ["mono16k", "stereo16k", "stereo44k", "mono48k", "stereo32k", "stereo22k", "mono24k", "short16k",
          "loud44k", "clicks16k", "intensity44k", "intensity22k", "mixed44k", "mixed22k", "mixed16k", "id3v1_tail",
          "cut_last_frame", "rate_change", "channel_change"]
PHI4 = ["mono8k", "stereo11k", "intensity11k", "mixed11k"]


def _signal(rate, length, channels, seed, kind="tones"):
    n = length if isinstance(length, int) else int(rate * length)
    t = np.arange(n) / rate
    rng = np.random.default_rng(seed)
    if kind == "loud":
        return np.clip(3.0 * rng.standard_normal((n, channels)), -1.0, 1.0).astype(np.float32)
    if kind == "clicks":
        x = 0.01 * rng.standard_normal((n, channels))
        x[::997] = 0.9
        return x.astype(np.float32)
    cols = [0.4 * np.sin(2 * np.pi * (150 + 170 * c) * t + 0.3 * c)
            + 0.2 * np.sin(2 * np.pi * 0.21 * rate * t * (1 + t)) + 0.05 * rng.standard_normal(n)
            for c in range(channels)]
    return np.stack(cols, 1).astype(np.float32)


def _mp3(x, rate, **options):
    import soundfile  # a test dependency: without it this fails rather than skipping
    out = io.BytesIO()
    soundfile.write(out, x, rate, format="MP3", subtype="MPEG_LAYER_III", **options)
    return out.getvalue()


def _frames(data):
    """(offset, header bytes) of each frame of a clean stream, walked by the frame sizes."""
    out, pos = [], 0
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        h = data[pos:pos + 4]
        mpeg1, layer3 = h[1] & 0x8, (h[1] >> 1) & 3 == 1
        assert layer3
        kbps = [[0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160],
                [0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320]][1 if mpeg1 else 0][h[2] >> 4]
        hz = [44100, 48000, 32000][(h[2] >> 2) & 3] >> (0 if mpeg1 else 1) >> (0 if h[1] & 0x10 else 1)
        out.append((pos, h))
        pos += (1152 if mpeg1 else 576) * kbps * 125 // hz + ((h[2] >> 1) & 1)
    assert pos == len(data)
    return out


def _intensity(data):
    """The clip with every joint-stereo header asking for intensity stereo too."""
    d = bytearray(data)
    for pos, h in _frames(data):
        if h[3] >> 6 == 1:
            d[pos + 3] |= 0x10
    return bytes(d)


def _bits(data, at, n):
    return (int.from_bytes(data[at // 8:at // 8 + 4].ljust(4, b"\0"), "big") >> (32 - at % 8 - n)) & ((1 << n) - 1)


def _mixed(data):
    """The clip with every short-block granule's side information flagged mixed (long bands below, short above)."""
    d, count = bytearray(data), 0
    for pos, h in _frames(data):
        mono, mpeg1 = h[3] >> 6 == 3, h[1] & 0x8
        assert h[1] & 1  # no CRC
        nch = 1 if mono else 2
        at = pos * 8 + 32 + (9 + (5 if mono else 3) + 4 * nch if mpeg1 else 8 + nch)
        for g in range(nch * (2 if mpeg1 else 1)):
            flag = at + g * (59 if mpeg1 else 63) + 12 + 9 + 8 + (4 if mpeg1 else 9)  # window switching
            if _bits(data, flag, 1) and _bits(data, flag + 1, 2) == 2:
                d[(flag + 3) // 8] |= 0x80 >> ((flag + 3) % 8)
                count += 1
    assert count > 5
    return bytes(d)


@pytest.fixture(scope="module")
def clips():
    c = {name: _mp3(_signal(rate, length, ch, seed), rate, **opts)
         for seed, (name, (rate, length, ch, opts)) in enumerate(SOURCES.items())}
    c["loud44k"] = _mp3(_signal(44100, 0.5, 2, 20, "loud"), 44100, **CBR)
    c["clicks16k"] = _mp3(_signal(16000, 1.0, 1, 21, "clicks"), 16000)
    c["intensity44k"] = _intensity(c["stereo44k"])
    c["intensity22k"] = _intensity(c["stereo22k"])
    c["intensity11k"] = _intensity(c["stereo11k"])
    for name, rate, channels in (("mixed44k", 44100, 2), ("mixed22k", 22050, 2), ("mixed16k", 16000, 1),
                                 ("mixed11k", 11025, 2), ("mixed8k", 8000, 2)):
        c[name] = _mixed(_mp3(_signal(rate, 1.0, channels, rate, "clicks"), rate))
    c["id3v1_tail"] = c["stereo32k"] + b"TAG" + b"x" * 125
    c["cut_last_frame"] = c["stereo44k"][:-150]
    c["rate_change"] = c["stereo44k"] + _mp3(_signal(48000, 0.4, 2, 22), 48000)
    c["channel_change"] = c["stereo44k"] + c["mono44k"]
    return c


def _sequence(package):
    with open(os.path.join(package, "audio_feature_extraction.json"), encoding="utf-8") as fh:
        return [(s["operation"]["type"], s["operation"].get("attrs") or {})
                for s in json.load(fh)["feature_extraction"]["sequence"]]


def _ours(package, data):
    value = data
    for kind, attrs in _sequence(package):
        value = AUDIO_STEPS[kind](value, **attrs)
    return value


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory, ort_genai):
    package = G4.build(str(tmp_path_factory.mktemp("gemma4")))
    return package, ort_genai.Model(package).create_multimodal_processor()


@pytest.fixture(scope="module")
def phi4(tmp_path_factory, ort_genai):
    package = P4.build(str(tmp_path_factory.mktemp("phi4mm")))
    return package, ort_genai.Model(package).create_multimodal_processor()


def test_clips_cover_the_cases(clips):
    """The generated clips hold what the comparisons claim to cover."""
    modes = {name: {h[3] >> 6 for _, h in _frames(clips[name])} for name in SOURCES}
    assert modes["mono16k"] == {3} and modes["stereo44k"] == {1}  # mono; joint stereo
    assert any(h[3] & 0x20 for _, h in _frames(clips["stereo44k"]))  # mid/side in use
    assert len({h[2] >> 4 for _, h in _frames(clips["stereo44k"])}) > 2  # variable bitrate
    assert len({h[2] >> 4 for _, h in _frames(clips["stereo16k"])[1:]}) == 1  # constant bitrate
    for name in SOURCES:  # LAME's tag frame first: 'Xing' (VBR) or 'Info' (CBR)
        assert b"Xing" in clips[name][:64] or b"Info" in clips[name][:64], name
    assert sum(1 for _, h in _frames(clips["intensity44k"]) if h[3] & 0x10) > 10
    assert {(h[1] >> 3) & 3 for name in ("stereo44k", "mono16k", "mono8k") for _, h in _frames(clips[name])} == \
        {3, 2, 0}  # MPEG-1, MPEG-2, MPEG-2.5


@pytest.mark.parametrize("name", GEMMA4)
def test_gemma4_features_equal_onnxruntime_genai(gemma4, clips, ort_genai, name):
    package, processor = gemma4
    embeds, mask = _ours(package, clips[name])
    out = processor("<|audio|>say", audios=ort_genai.Audios.open_bytes(clips[name]))
    theirs = out["audio_embeds"].as_numpy()
    assert theirs.shape == (1,) + embeds.shape and theirs.dtype == embeds.dtype == np.float32
    np.testing.assert_array_equal(embeds[None], theirs)
    np.testing.assert_array_equal(mask[None], out["audio_attention_mask"].as_numpy())


@pytest.mark.parametrize("name", PHI4)
def test_phi4_features_equal_onnxruntime_genai(phi4, clips, ort_genai, name):
    package, processor = phi4
    embeds, mask, size = _ours(package, clips[name])
    out = processor("<|audio_1|>hi", audios=ort_genai.Audios.open_bytes(clips[name]))
    theirs = out["audio_embeds"].as_numpy()
    assert theirs.shape == (1,) + embeds.shape
    np.testing.assert_array_equal(embeds[None], theirs)


def test_decoded_layout(clips):
    """Samples per frame as dr_mp3 gives them: every frame whole (the tag frame's silence included), the rate and
    channel count of the first frame."""
    pcm, rate = decode_mp3(clips["stereo44k"])
    assert rate == 44100 and pcm.dtype == np.float32 and pcm.shape == (1152 * len(_frames(clips["stereo44k"])), 2)
    assert not pcm[:1152].any() and pcm[1152 + 576:].any()
    pcm, rate = decode_mp3(clips["mono8k"])
    assert rate == 8000 and pcm.shape == (576 * len(_frames(clips["mono8k"])), 1)
    # the later frames appended at the first rate; the frame before the change dropped (the next header is not
    # the stream's: minimp3 resynchronises from that frame, which no longer matches what follows it)
    pcm, rate = decode_mp3(clips["rate_change"])
    assert rate == 44100 and pcm.shape[0] == 1152 * (len(_frames(clips["stereo44k"])) - 1
                                                      + len(_frames(clips["rate_change"][len(clips["stereo44k"]):])))


def test_refused_as_onnxruntime_genai_refuses(gemma4, clips, ort_genai):
    package, processor = gemma4

    def theirs(data):
        processor("<|audio|>say", audios=ort_genai.Audios.open_bytes(data))

    tagged = b"ID3\x04\x00\x00\x00\x00\x00\x0a" + bytes(10) + clips["mono16k"]  # an ID3v2 tag in front
    with pytest.raises(ValueError, match="ID3"):
        decode_audio(tagged)
    with pytest.raises(Exception, match="Cannot detect audio stream format"):
        theirs(tagged)
    for junk in (b"\xff\xfb" + bytes(100), b"\xff\xfb\x90\x64" + bytes(np.random.default_rng(0).integers(
            0, 256, 3000, dtype=np.uint8))):  # a sync, then no frame
        with pytest.raises(MP3DecodeError, match="no decodable"):
            decode_audio(junk)
        with pytest.raises(Exception, match="unexpected error on MP3 stream"):
            theirs(junk)
    with pytest.raises(MP3DecodeError, match="frame sync"):
        decode_mp3(b"not audio at all")
    layer2 = (b"\xff\xfd\x80\x00" + bytes(413)) * 6  # MPEG-1 Layer II, 128 kbps, 44.1 kHz: not decoded here
    with pytest.raises(NotImplementedError, match="Layer I/II"):
        decode_mp3(layer2)


def test_damaged_streams_never_fault(clips):
    """Cut and corrupted streams decode or raise MP3DecodeError; no index leaves its array (the kernels check
    or bound every one)."""
    pcm, _ = decode_mp3(clips["mixed8k"])  # mixed blocks at 8 kHz reorder 24 values past a channel's end
    assert pcm.shape == (576 * len(_frames(clips["mixed8k"])), 2)
    rng = np.random.default_rng(3)
    for k in range(60):
        d = bytearray(clips[["stereo44k", "mono16k", "mono8k"][k % 3]])
        d = d[:int(rng.integers(5, len(d)))] if k % 2 else d
        for _ in range(int(rng.integers(1, 40))):
            d[int(rng.integers(4, len(d)))] = int(rng.integers(0, 256))
        try:
            pcm, _ = decode_mp3(bytes(d))
        except MP3DecodeError:
            continue
        assert pcm.dtype == np.float32 and pcm.ndim == 2
