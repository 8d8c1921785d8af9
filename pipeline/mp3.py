"""MPEG audio Layer III decoding as onnxruntime-extensions' ``AudioDecoder`` does it, so that an MP3 clip gives
onnxruntime-genai's samples bit for bit.

onnxruntime-extensions decodes MP3 with dr_mp3 v0.6.40 (dr_libs commit 660795b, minimp3 inside), compiled with
``DR_MP3_FLOAT_OUTPUT`` and read through ``drmp3_init_memory`` / ``drmp3_read_pcm_frames_f32`` in chunks of 262144
frames.  ``decode_mp3`` reproduces that path as built for x86-64, where minimp3 always takes its SSE code: the same
float32 operations in the same order, no fused multiply-add.  Where the SSE code rounds differently from minimp3's
scalar code (the sums that finish the DCT-II of the polyphase filter bank, ``t2 + (t3[i] + t3[i+1])``) the SSE
order is kept.  Samples are the synthesis sums times ``1/32768``, never rounded to int16.

What dr_mp3 v0.6.40 does, and so what is done here:

- the stream must begin with a frame sync (``0xFF``, then three set bits): onnxruntime-extensions recognises MP3
  only so, and refuses a clip that opens with an ID3v2 tag ("Cannot detect audio stream format");
- frames are found as minimp3 finds them: a header counts once the next frames (up to 10) follow it with the same
  version, layer, rate and free-format flag; free-format frames are sized by the distance to the next header;
  bytes that are not frames (junk, a trailing ID3v1 tag) are skipped, and the frame just before them is dropped
  and the decoder state reset (minimp3 resets when the next header is not where the frame size says);
- every decoded frame is output whole: no encoder delay or padding is removed, and a Xing/Info/LAME tag frame is
  decoded as an ordinary (silent) frame, so a clip begins with that frame's 1152 (576 below 32 kHz) zeros;
- a frame whose bit reservoir reaches back past what was kept (the first frames after the start or a resync)
  gives no samples; a frame with invalid side information gives none and resets the decoder;
- mono, stereo, joint stereo (mid/side and intensity, MPEG-1 and MPEG-2 rules), long, short and mixed blocks, CRC
  (skipped, not checked), free format; MPEG-1 (32/44.1/48 kHz), MPEG-2 (16/22.05/24 kHz), MPEG-2.5 (8/11.025/12
  kHz), Layer III only for MPEG-2.5; minimp3's own tables are kept where they are not the standard's (its scale
  factor bands at 8 kHz);
- the channel count and rate are the first decoded frame's; a later frame with another rate is appended as it
  is, one with another channel count is copied as dr_mp3 copies it (the stream's count of samples per frame from
  the frame's own buffer, so partly the previous frame's samples).

Bad input: data that does not begin with a frame sync, or holds no decodable frame, raises ``MP3DecodeError`` (a
``ValueError``; onnxruntime-extensions refuses both).  Layers I and II raise ``NotImplementedError`` (dr_mp3 would
decode them).  Truncated or corrupt frames are handled as dr_mp3 handles them (skipped, resynchronised).  Scratch
that minimp3 reads without having written it in that frame (intensity positions reused by the scale factor
selection information, main data past a corrupt frame's end) holds here what the previous frame left, as the
reused stack frame does there.  Two cases read memory no frame may have written, and may then differ: a corrupt
header that asks a mono stream for intensity stereo, and mixed blocks at 8 kHz (minimp3's band table there has 39
bands for the 36 scale factors it computes, so the last three take stale gains; encoders here write no mixed
blocks).  Every array index is checked or bounded before use (Numba does not check).

Invariants: ``decode_mp3`` returns float32 ``[frames, channels]`` (C order) and the first frame's rate; the kernels
are ``@njit(cache=True)`` and allocate their state per call, so calls are independent and thread-safe.
"""
from __future__ import annotations

import base64

import numpy as np
from numba import njit

__all__ = ["MP3DecodeError", "is_mp3", "decode_mp3"]


class MP3DecodeError(ValueError):
    """The bytes hold no MP3 stream onnxruntime-extensions would decode."""


def is_mp3(data: bytes) -> bool:
    """onnxruntime-extensions' test: an MPEG audio frame sync (11 set bits) at byte 0."""
    return len(data) >= 4 and data[0] == 0xFF and (data[1] & 0xE0) == 0xE0


# ---------------------------------------------------------------------------------------------------------------
# Tables.  The Huffman codes are the standard's (ISO 11172-3 tables B.7): per table its size n, then for x, y in
# 0..n-1 the code lengths (one hex digit, g-j for 16-19) and the codes concatenated, big-endian, in base64.
# Tables 16-23 share table 16's codes and 24-31 table 24's (they differ in linbits); 0, 4 and 14 have no codes.
_HUFFMAN = {
    1: (2,
         "1323",
         "lAA="),
    2: (3,
         "136335556",
         "oFkIxAA="),
    3: (3,
         "226325556",
         "4EoRiAA="),
    5: (4,
         "1367336766787678",
         "oYKyIEHFDgIYECAA"),
    6: (4,
         "3357324544566567",
         "7KB0YlQgIYwgAA=="),
    7: (6,
         "13688934677865788977899977899a889aaa",
         "ooTEAUzHFBQMsg0RCAIMFiQPBYCDhgkHAMAQYEAoBgEAAA=="),
    8: (6,
         "23688932488864688988899a8789aa9899bb",
         "4MJBgFqQgEgY5ihwOAxMRDwaCgEDQoQCwFAEGAgEAIAQAA=="),
    9: (6,
         "335689334568445678656778767789878899",
         "9ScHgfRSjA7sggQCnmJFBQEWOJDAgBDggMBAYAA="),
    10: (8,
         "1368999a3467898866789a997789aa9a889aaaaa99aabbab889aaabb989aabbb",
         "ooXEYeBgIsyBgkFQwHLJHiogCgJgYcNFhEFwLhIBxQTEIXg2CwEgGHwsFINAVAoAoAw4NBQFggAwBQAgkIA4EAIAQAQAAA=="),
    11: (8,
         "23578989334688785567898876798a8988899a9a889aabab87789aaa8789aaaa",
         "4owRCEVB9aFEAiLClnNJDwfFAUyWTHY2CQYBSMhHx0HgQA4Cjg0IATBEB4EAODhgkNBwEgIAIWEBgMAwBgEAAA=="),
    12: (8,
         "4357899933457788545678786566788876778889878889898778899a9889999a",
         "nQQlInEwa9ZJcgNBcXWcVHhQOio8wkOBwKgNLExIQCQKUER8dEQaCAIbGCw8KA4EAENhgQDAMAwCAAA="),
    13: (16,
         "1467899a9abbccdd3467889999aabccc667899aa9aabbcdd77899aaaabbbbcdd8799aabbabbccdde989aaabbbbcbddee99aa"
         "bbbbbcccddeea9abbbccccdddegg989aabbccccddeffa9aabbbdcddeeegfaaabbccdcdedefghbaabccccdddefffgbbbccdcd"
         "eefffgggcbcdddeeeeefgfggdccdddfeehfffhggccdeeefeffggjijg",
         "qcVIhmLhHFQaBEBoCGBYArAJtDCY+NCwQh8MBADAHwIwFgDjzS5IOxiJogh0KAeBQBsCEBUAQLFCUejgTxJEAKwmA4BKBoB8AyAO"
         "IyA8HIwiWHILYbBJBuBSBgA1ALgDA6GxkMAmCMF0KgTQdAngdAlAMQCkARF4tE4Sg5heC0E8IoKYI4GQDsBMASAB4kCIOAvhcCqC"
         "2C0CsCSBNAggMwCwAKwAqFYoHgsDcJwSAVwTgPQLgGwCUAeACgAQDUMhSEoLAdg2AoghATAHIBsASgCQATgAsIwhB8HIKgUgSAKA"
         "F4DoA3AKgCwAaACYACwNQZBcEwIwHgGYEgDcA0AiAFwA2ADgASAA4IgQAcAnAxAlgPANADAAoAGgAcACQAIgASAAoFoFQIgIADgB"
         "kAYgFoA+AJgBgAPAAoADgAMAAYDABcBQBOAkARgDUAVAEAALgA0AFAAYAAIACAAEAgAeARAGwBkAUADoAWAEQAYACAAEAAAQAAQA"
         "AAAAgA=="),
    15: (16,
         "345778999aabbbcd43567788899aaabb55567788899aabbb6667788999aaabbb7677889999aaabbb8778889999aabbbc9788"
         "89999aaabbcc9889999aaaaabbbc9889999aaaabbccc989999aaabbbbccca999aaaaabbbbcdca999aaaabbbbcccdba9aaabb"
         "bbbbccddbaaaabbbbcccccddcbbbbbbbccccddcdcbbbbbbcccccdddd",
         "+Sar0w+Gwsj2Ngdw1hRB6Af7YNrkh6ZlRGGgpiCFIOwSTi9hSiOzAoIAyE4PgoA4BC64yrTn5uXSYOxdEgNglgyA60WVKEM5L5PJ"
         "A5FkRQxCEC4DaalRoR0aFslD4YCeH4WgfAoAmPqA8ODIuE4gjcVxHDMJIMwRgHjaamJeLBLIQ9C2JIcBUEAFgFQGS0VlJNJI/HAu"
         "CaIQXhDBgBqBIAoRyIhjwdDEWBMEMNQRwbAmAnAXAPG0ajMXi0KQdByGASAcgpAuA2A+AJFYVCgSiMIAaBWEYG4KgMgOgJAFgCw7"
         "CIHg3DILglBBBiCcDAEAFgDQBwAcLYWBOEwRA/BoC0D4GgDgCYBwBAAkAGD2DwHQNQXgrBABYCUBgBEAwAeAKACAAgjglBEB4DgF"
         "AIgNAKgIAFADACAAwAIAAA=="),
    16: (16,
         "146899aabbbcccd934678999aaabcbc8667899aababbbcc987899aaabbcccdda9899aabbbcccddd99899abbcbccdddeaa99a"
         "bbbbccccddeaa9aabbbccddddffaaaabbbccddddeeeabaabbccddddededbbbabccccdeeeffeacbbbccdeeeeeedebcccccddd"
         "dfeeeegbecccddeeegfffhfbddbceedeefgfhfeb98899aaabbbbbbb8",
         "qcWEofjcLorBKiKDyDhDDC8BFoYUIx8NReKYliIHcMkNYZ4SeaXJiGOhnFoUIkB/DqG4NEM4IFpUnIpAHIYxXE8IwPwNQMcMGFtB"
         "olkhEII5jKLMUgmxCA9g4gxYX4LUCSEPDscDMLkVohIjg/Q6AyAYQL0DeggN42GgyC4FkKAQogIegcgbIYELcFlgUMQwFsWBSidE"
         "oIKHwGXDGhdAvgN5BugECqKgoifE4I8QQPkNWGRDEBfwtcLJCxAHE0JgkiNEGIAHqGqDLBigwAW+FnCxgsACxFiBEMPoe4dIcobY"
         "YkLnC4QtAG6g3IG3AQPMPAdg5hxhvhjAuoLmC4AtELICwgb4NoAYMoOAN4NoNgMKGCC+hbAbwDdhYYNwDag2AAQLrDTDSDQC5Bew"
         "t4LTCygbHBuYNtBtgNgwbCAILyFxDMF2FrBaQWYLHCxQbEDYwNnBsEDZgbIAAMCgcFgoEQLAkBoDAFAHAKAMAIGA"),
    24: (16,
         "4467899aabbbbbc94456788999aaaaa865677889999aaab776778889999aaaa78778888999aaaab79788889999aaaaa79888"
         "89999aaaaab7a8889999aaaaabb8a99999999aaaabb8a999999aaaaabbb8b9999aaaaaabbbb8ba999aaaaaabbbb8baaaaaaa"
         "aabbbbb8baaaaaaabbbbbbb8caaaaaabbbbbbbb88777777777788884",
         "/bqElBnw2TVKdUaolNqBUCCx2VmjwT02GixlHVlP0pRcqvtTKiQDw3WewlsqidpOh0lRnlxoZ9dG4zF8slFTdJUPISciLDv7s4NJ"
         "kLxYFDTJHUODoPCgX53cmsymAtFVT1LUZQYY+Xt5dXFrs5hrlW1KTRI0QQQKbNzb21pstiLtYVMTlKkbQmX0RatqNBmslgrpYqlQ"
         "EvR5DEBF5EFPY7FX69WquU1QUxSFE0El7LmFqcXC3WavVhS06TBIkVQkX8upbgpRitKtUKRPk1StH0UQdAJdy4FqBlEKEnicJmly"
         "SI4hqCoALwXIthZwRNiWJQkyQI0iKFIDL4XYuJbS0llAkCUYRZEkLQhAy/F6LoW8tZaCzFkACsoTIjxosSHDBAcFAwEw"),}
_LINBITS = np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                     1, 2, 3, 4, 6, 8, 10, 13, 4, 5, 6, 7, 8, 9, 11, 13], np.int32)
# count1 table A (v, w, x, y packed as 8v + 4w + 2x + y): (length, code); table B is 4 bits, the value inverted
_COUNT1_A = ((1, 0b1), (4, 0b0101), (4, 0b0100), (5, 0b00101), (4, 0b0110), (6, 0b000101), (5, 0b00100),
             (6, 0b000100), (4, 0b0111), (5, 0b00011), (5, 0b00110), (6, 0b000000), (5, 0b00111), (6, 0b000010),
             (6, 0b000011), (6, 0b000001))


def _trees():
    """Binary decoding trees for all code tables, one int32 array ``[nodes, 2]``: a child >= 0 is a node, < 0
    a leaf ``-1 - value``.  Roots per table number (32 pair tables, then count1 A as 32 and B as 33); -1 where a
    table has no codes."""
    nodes = []
    roots = np.full(34, -1, np.int32)

    def build(codes):
        root = len(nodes)
        nodes.append([0, 0])
        filled = {}
        for value, (length, code) in codes.items():
            node = root
            for i in range(length - 1, -1, -1):
                bit = (code >> i) & 1
                if i == 0:
                    nodes[node][bit] = -1 - value
                    filled[(node, bit)] = True
                elif (node, bit) in filled:
                    node = nodes[node][bit]
                else:
                    nodes.append([0, 0])
                    nodes[node][bit] = len(nodes) - 1
                    filled[(node, bit)] = True
                    node = len(nodes) - 1
        return root

    for table, (n, lengths, packed) in _HUFFMAN.items():
        raw = int.from_bytes(base64.b64decode(packed), "big")
        total = len(base64.b64decode(packed)) * 8
        codes, at = {}, 0
        for i, ch in enumerate(lengths):
            length = int(ch, 16) if ch in "0123456789abcdef" else 16 + "ghij".index(ch)
            code = (raw >> (total - at - length)) & ((1 << length) - 1)
            codes[(i // n) * 16 + i % n] = (length, code)
            at += length
        roots[table] = build(codes)
    for table, first in ((16, 17), (24, 25)):
        roots[first:first + 7] = roots[table]
    roots[32] = build({v: c for v, c in enumerate(_COUNT1_A)})
    roots[33] = build({v: (4, 15 - v) for v in range(16)})
    tree = np.array(nodes, np.int32)
    tree.flags.writeable = False
    return tree, roots


_TREE, _ROOTS = _trees()

# x ** (4/3) for 0..128 as minimp3 tabulates it (rounded to 6 decimals), negated ahead of it for the signed
# small values: index 16 + value, value in -15..128
_POW43 = np.array([0.0] + [float(f"{-(x ** (4 / 3)):.6f}") for x in range(1, 16)]
                  + [0.0, 1.0] + [float(f"{x ** (4 / 3):.6f}") for x in range(2, 129)], np.float32)

# scale factor band widths, rows by rate (11.025/12, 8, 22.05, 24, 16, 44.1, 48, 32 kHz), minimp3's (its 8 kHz
# rows are not the standard's); long (22 bands), short (13 x 3 windows) and mixed blocks, zero-terminated
_SFB_LONG = [
    [6, 6, 6, 6, 6, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 38, 46, 52, 60, 68, 58, 54],
    [12, 12, 12, 12, 12, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 76, 90, 2, 2, 2, 2, 2],
    [6, 6, 6, 6, 6, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 38, 46, 52, 60, 68, 58, 54],
    [6, 6, 6, 6, 6, 6, 8, 10, 12, 14, 16, 18, 22, 26, 32, 38, 46, 54, 62, 70, 76, 36],
    [6, 6, 6, 6, 6, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 38, 46, 52, 60, 68, 58, 54],
    [4, 4, 4, 4, 4, 4, 6, 6, 8, 8, 10, 12, 16, 20, 24, 28, 34, 42, 50, 54, 76, 158],
    [4, 4, 4, 4, 4, 4, 6, 6, 6, 8, 10, 12, 16, 18, 22, 28, 34, 40, 46, 54, 54, 192],
    [4, 4, 4, 4, 4, 4, 6, 6, 8, 10, 12, 16, 20, 24, 30, 38, 46, 56, 68, 84, 102, 26]]
_SFB_SHORT = [  # band widths, each for 3 windows
    [4, 4, 4, 6, 8, 10, 12, 14, 18, 24, 30, 40, 18],
    [8, 8, 8, 12, 16, 20, 24, 28, 36, 2, 2, 2, 26],
    [4, 4, 4, 6, 6, 8, 10, 14, 18, 26, 32, 42, 18],
    [4, 4, 4, 6, 8, 10, 12, 14, 18, 24, 32, 44, 12],
    [4, 4, 4, 6, 8, 10, 12, 14, 18, 24, 30, 40, 18],
    [4, 4, 4, 4, 6, 8, 10, 12, 14, 18, 22, 30, 56],
    [4, 4, 4, 4, 6, 6, 10, 12, 14, 16, 20, 26, 66],
    [4, 4, 4, 4, 6, 8, 12, 16, 20, 26, 34, 42, 12]]
_SFB_MIXED = [  # long bands (6 below 32 kHz, 8 above), then short bands, each for 3 windows
    [6, 6, 6, 6, 6, 6] + [w for w in (6, 8, 10, 12, 14, 18, 24, 30, 40, 18) for _ in range(3)],
    [12, 12, 12, 4, 4, 4] + [w for w in (8, 12, 16, 20, 24, 28, 36, 2, 2, 2) for _ in range(3)] + [26, 26, 26],
    [6, 6, 6, 6, 6, 6] + [w for w in (6, 6, 8, 10, 14, 18, 26, 32, 42, 18) for _ in range(3)],
    [6, 6, 6, 6, 6, 6] + [w for w in (6, 8, 10, 12, 14, 18, 24, 32, 44, 12) for _ in range(3)],
    [6, 6, 6, 6, 6, 6] + [w for w in (6, 8, 10, 12, 14, 18, 24, 30, 40, 18) for _ in range(3)],
    [4, 4, 4, 4, 4, 4, 6, 6] + [w for w in (4, 6, 8, 10, 12, 14, 18, 22, 30, 56) for _ in range(3)],
    [4, 4, 4, 4, 4, 4, 6, 6] + [w for w in (4, 6, 6, 10, 12, 14, 16, 20, 26, 66) for _ in range(3)],
    [4, 4, 4, 4, 4, 4, 6, 6] + [w for w in (4, 6, 8, 12, 16, 20, 26, 34, 42, 12) for _ in range(3)]]


def _sfb_rows():
    """``[24, 40]`` uint8, zero-terminated: rows 0-7 long, 8-15 short, 16-23 mixed, by rate."""
    rows = np.zeros((24, 40), np.uint8)
    for r in range(8):
        rows[r, :22] = _SFB_LONG[r]
        rows[8 + r, :39] = [w for w in _SFB_SHORT[r] for _ in range(3)]
        rows[16 + r, :len(_SFB_MIXED[r])] = _SFB_MIXED[r]
    rows.flags.writeable = False
    return rows


_SFB = _sfb_rows()
# scale factor partitions (ISO 13818-3 nr_of_sfb, and MPEG-1's 6/5/5/5 first): rows long, mixed, short
_SCF_PARTITIONS = np.array([
    [6, 5, 5, 5, 6, 5, 5, 5, 6, 5, 7, 3, 11, 10, 0, 0, 7, 7, 7, 0, 6, 6, 6, 3, 8, 8, 5, 0],
    [8, 9, 6, 12, 6, 9, 9, 9, 6, 9, 12, 6, 15, 18, 0, 0, 6, 15, 12, 0, 6, 12, 9, 6, 6, 18, 9, 0],
    [9, 9, 6, 12, 9, 9, 9, 9, 9, 9, 12, 6, 18, 18, 0, 0, 12, 12, 12, 0, 12, 9, 9, 6, 15, 12, 9, 0]], np.int32)
_SCF_MOD = np.array([5, 5, 4, 4, 5, 5, 4, 1, 4, 3, 1, 1, 5, 6, 6, 1, 4, 4, 4, 1, 4, 3, 1, 1], np.int32)
_SCFC_MPEG1 = np.array([0, 1, 2, 3, 12, 5, 6, 7, 9, 10, 11, 13, 14, 15, 18, 19], np.int32)  # slen1 * 4 + slen2
_PREAMP = np.array([1, 1, 1, 1, 2, 2, 3, 3, 3, 2], np.int32)
# 2**(-k/4) for k = 0..3, times 2**-30
_EXPFRAC = np.array([9.31322575e-10, 7.83145814e-10, 6.58544508e-10, 5.53767716e-10], np.float32)
# half the bitrate in kbps: [MPEG-1][layer - 1][index]
_HALFRATE = np.array([
    [[0, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 72, 80],
     [0, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 72, 80],
     [0, 16, 24, 28, 32, 40, 48, 56, 64, 72, 80, 88, 96, 112, 128]],
    [[0, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160],
     [0, 16, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192],
     [0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224]]], np.int32)
_RATES = np.array([44100, 48000, 32000], np.int32)
# intensity stereo positions (MPEG-1): (left, right) gains for is_pos 0..6
_PAN = np.array([0, 1, 0.21132487, 0.78867513, 0.36602540, 0.63397460, 0.5, 0.5, 0.63397460, 0.36602540,
                 0.78867513, 0.21132487, 1, 0], np.float32)
# alias reduction butterflies: cs, ca
_ALIAS = np.array([[0.85749293, 0.88174200, 0.94962865, 0.98331459, 0.99551782, 0.99916056, 0.99989920,
                    0.99999316],
                   [0.51449576, 0.47173197, 0.31337745, 0.18191320, 0.09457419, 0.04096558, 0.01419856,
                    0.00369997]], np.float32)
_TWID9 = np.array([0.73727734, 0.79335334, 0.84339145, 0.88701083, 0.92387953, 0.95371695, 0.97629601, 0.99144486,
                   0.99904822, 0.67559021, 0.60876143, 0.53729961, 0.46174861, 0.38268343, 0.30070580, 0.21643961,
                   0.13052619, 0.04361938], np.float32)
_TWID3 = np.array([0.79335334, 0.92387953, 0.99144486, 0.60876143, 0.38268343, 0.13052619], np.float32)
# the 36-point IMDCT windows, folded: normal (and start) blocks, stop blocks
_MDCT_WINDOW = np.array([
    [0.99904822, 0.99144486, 0.97629601, 0.95371695, 0.92387953, 0.88701083, 0.84339145, 0.79335334, 0.73727734,
     0.04361938, 0.13052619, 0.21643961, 0.30070580, 0.38268343, 0.46174861, 0.53729961, 0.60876143, 0.67559021],
    [1, 1, 1, 1, 1, 1, 0.99144486, 0.92387953, 0.79335334, 0, 0, 0, 0, 0, 0, 0.13052619, 0.38268343, 0.60876143]],
    np.float32)
# the polyphase DCT-II's secants, three per stage row
_SEC = np.array([10.19000816, 0.50060302, 0.50241929, 3.40760851, 0.50547093, 0.52249861, 2.05778098, 0.51544732,
                 0.56694406, 1.48416460, 0.53104258, 0.64682180, 1.16943991, 0.55310392, 0.78815460, 0.97256821,
                 0.58293498, 1.06067765, 0.83934963, 0.62250412, 1.72244716, 0.74453628, 0.67480832, 5.10114861],
                np.float32)
# the synthesis window (the standard's D[] times 65536, rounded, in minimp3's folded order): 15 rows of 8 pairs
_SYNTH_WINDOW = np.array([
    -1, 26, -31, 208, 218, 401, -519, 2063, 2000, 4788, -5517, 7134, 5959, 35640, -39336, 74992,
    -1, 24, -35, 202, 222, 347, -581, 2080, 1952, 4425, -5879, 7640, 5288, 33791, -41176, 74856,
    -1, 21, -38, 196, 225, 294, -645, 2087, 1893, 4063, -6237, 8092, 4561, 31947, -43006, 74630,
    -1, 19, -41, 190, 227, 244, -711, 2085, 1822, 3705, -6589, 8492, 3776, 30112, -44821, 74313,
    -1, 17, -45, 183, 228, 197, -779, 2075, 1739, 3351, -6935, 8840, 2935, 28289, -46617, 73908,
    -1, 16, -49, 176, 228, 153, -848, 2057, 1644, 3004, -7271, 9139, 2037, 26482, -48390, 73415,
    -2, 14, -53, 169, 227, 111, -919, 2032, 1535, 2663, -7597, 9389, 1082, 24694, -50137, 72835,
    -2, 13, -58, 161, 224, 72, -991, 2001, 1414, 2330, -7910, 9592, 70, 22929, -51853, 72169,
    -2, 11, -63, 154, 221, 36, -1064, 1962, 1280, 2006, -8209, 9750, -998, 21189, -53534, 71420,
    -2, 10, -68, 147, 215, 2, -1137, 1919, 1131, 1692, -8491, 9863, -2122, 19478, -55178, 70590,
    -3, 9, -73, 139, 208, -29, -1210, 1870, 970, 1388, -8755, 9935, -3300, 17799, -56778, 69679,
    -3, 8, -79, 132, 200, -57, -1283, 1817, 794, 1095, -8998, 9966, -4533, 16155, -58333, 68692,
    -4, 7, -85, 125, 189, -83, -1356, 1759, 605, 814, -9219, 9959, -5818, 14548, -59838, 67629,
    -4, 7, -91, 117, 177, -106, -1428, 1698, 402, 545, -9416, 9916, -7154, 12980, -61289, 66494,
    -5, 6, -97, 111, 163, -127, -1498, 1634, 185, 288, -9585, 9838, -8540, 11455, -62684, 65290], np.float32)
for _t in (_LINBITS, _ROOTS, _POW43, _SCF_PARTITIONS, _SCF_MOD, _SCFC_MPEG1, _PREAMP, _EXPFRAC, _HALFRATE, _RATES,
           _PAN, _ALIAS, _TWID9, _TWID3, _MDCT_WINDOW, _SEC, _SYNTH_WINDOW):
    _t.flags.writeable = False


# ---------------------------------------------------------------------------------------------------------------
# Kernels.  Float arithmetic is float32 throughout, each operation in minimp3's order; comments name its steps.

# side information of one granule and channel: int32 fields of a row of ``gr``
_PART23, _BIGV, _SFC, _GAIN, _BTYPE, _MIXED, _NLONG, _NSHORT = 0, 1, 2, 3, 4, 5, 6, 7
_TABLE, _REGION, _SUBGAIN = 8, 11, 14  # three each
_PREFLAG, _SCALE, _COUNT1, _SCFSI, _SFBROW = 17, 18, 19, 20, 21
_NFIELDS = 22
_RESERVOIR = 511
_MAX_FRAME = 2304  # the largest free-format frame minimp3 accepts
_CHUNK_FRAMES = 1024 * 256  # onnxruntime-extensions reads dr_mp3's samples in chunks of this many frames
_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_HALF = np.float32(0.5)
_SQRT3_2 = np.float32(0.86602540)
_FOUR_THIRDS = np.float32(np.float32(4.0) / np.float32(3.0))
_TWO_NINTHS = np.float32(np.float32(2.0) / np.float32(9.0))
_SQRT2 = np.float32(1.41421356)
_SCALE_OUT = np.float32(1.0 / 32768.0)


@njit(cache=True, nogil=True)
def _get_bits(buf, bs, n):
    """minimp3's bit reader: ``n`` bits from bit ``bs[0]`` of the bytes from ``buf[bs[2]]``, or 0 once past the
    limit ``bs[1]`` (the position advances either way).  The caller keeps ``bs[2] + bs[1] / 8`` within ``buf``."""
    pos = bs[0]
    bs[0] = pos + n
    if n == 0 or pos + n > bs[1]:
        return 0
    s = pos & 7
    p = bs[2] + (pos >> 3)
    nxt = np.int64(buf[p]) & (255 >> s)
    p += 1
    cache = np.int64(0)
    shl = n + s - 8
    while shl > 0:
        cache |= nxt << shl
        nxt = np.int64(buf[p])
        p += 1
        shl -= 8
    return cache | (nxt >> -shl)


@njit(cache=True, nogil=True)
def _bit(buf, pos):
    """Bit ``pos`` of ``buf``, 0 past its end (the Huffman reader's look-ahead)."""
    i = pos >> 3
    if i >= buf.shape[0]:
        return 0
    return (np.int64(buf[i]) >> (7 - (pos & 7))) & 1


@njit(cache=True, nogil=True)
def _pow43(x):
    """|x| ** (4/3) as minimp3 computes it: its table to 128, above a second-order expansion around the nearest
    multiple of 64 (of 8x below 1024).  x <= 15 + 8191, so the table index stays <= 144."""
    if x < 129:
        return _POW43[16 + x]
    mult = np.float32(256.0)
    if x < 1024:
        mult = np.float32(16.0)
        x <<= 3
    sign = 2 * x & 64
    frac = np.float32((x & 63) - sign) / np.float32((x & ~63) + sign)
    return _POW43[16 + ((x + sign) >> 6)] * (_F1 + frac * (_FOUR_THIRDS + frac * _TWO_NINTHS)) * mult


@njit(cache=True, nogil=True)
def _ldexp_q2(y, exp_q2):
    """y * 2 ** (-exp_q2 / 4), in steps of at most 2 ** -30 as minimp3 takes them."""
    while True:
        e = min(120, exp_q2)
        y *= _EXPFRAC[e & 3] * np.float32((1 << 30) >> (e >> 2))
        exp_q2 -= e
        if exp_q2 <= 0:
            return y


@njit(cache=True, nogil=True)
def _hdr_valid(h, o):
    b1, b2 = h[o + 1], h[o + 2]
    return (h[o] == 0xFF and ((b1 & 0xF0) == 0xF0 or (b1 & 0xFE) == 0xE2) and ((b1 >> 1) & 3) != 0
            and (b2 >> 4) != 15 and ((b2 >> 2) & 3) != 3)


@njit(cache=True, nogil=True)
def _hdr_compare(h1, o1, h2, o2):
    """Same version, layer, rate and free-format flag, and h2 a valid header."""
    return (_hdr_valid(h2, o2) and ((h1[o1 + 1] ^ h2[o2 + 1]) & 0xFE) == 0 and ((h1[o1 + 2] ^ h2[o2 + 2]) & 0x0C) == 0
            and ((h1[o1 + 2] & 0xF0) == 0) == ((h2[o2 + 2] & 0xF0) == 0))


@njit(cache=True, nogil=True)
def _hdr_kbps(h, o):
    return 2 * _HALFRATE[1 if h[o + 1] & 0x8 else 0, ((h[o + 1] >> 1) & 3) - 1, h[o + 2] >> 4]


@njit(cache=True, nogil=True)
def _hdr_hz(h, o):
    return _RATES[(h[o + 2] >> 2) & 3] >> (0 if h[o + 1] & 0x8 else 1) >> (0 if h[o + 1] & 0x10 else 1)


@njit(cache=True, nogil=True)
def _hdr_samples(h, o):
    if (h[o + 1] & 6) == 6:
        return 384
    return 576 if (h[o + 1] & 14) == 2 else 1152


@njit(cache=True, nogil=True)
def _hdr_frame_bytes(h, o, free_format_bytes):
    n = _hdr_samples(h, o) * _hdr_kbps(h, o) * 125 // _hdr_hz(h, o)
    if (h[o + 1] & 6) == 6:
        n &= ~3
    return n if n else free_format_bytes


@njit(cache=True, nogil=True)
def _hdr_padding(h, o):
    if h[o + 2] & 0x2:
        return 4 if (h[o + 1] & 6) == 6 else 1
    return 0


@njit(cache=True, nogil=True)
def _match_frame(d, o, nbytes, frame_bytes):
    """Whether up to 10 frames follow the header at ``o`` (nbytes from there) with the same stream parameters."""
    i = 0
    for nmatch in range(10):
        i += _hdr_frame_bytes(d, o + i, frame_bytes) + _hdr_padding(d, o + i)
        if i + 4 > nbytes:
            return nmatch > 0
        if not _hdr_compare(d, o, d, o + i):
            return False
    return True


@njit(cache=True, nogil=True)
def _find_frame(d, o, nbytes, st):
    """minimp3's sync search in ``d[o:o + nbytes]``: (offset of the frame found or nbytes, its size with padding
    or 0); sets the free-format frame size ``st[0]``."""
    for i in range(nbytes - 4):
        h = o + i
        if not _hdr_valid(d, h):
            continue
        frame_bytes = _hdr_frame_bytes(d, h, st[0])
        frame_and_padding = frame_bytes + _hdr_padding(d, h)
        k = 4
        while frame_bytes == 0 and k < _MAX_FRAME and i + 2 * k < nbytes - 4:
            if _hdr_compare(d, h, d, h + k):
                fb = k - _hdr_padding(d, h)
                nextfb = fb + _hdr_padding(d, h + k)
                if not (i + k + nextfb + 4 > nbytes or not _hdr_compare(d, h, d, h + k + nextfb)):
                    frame_and_padding = k
                    frame_bytes = fb
                    st[0] = fb
            k += 1
        if ((frame_bytes and i + frame_and_padding <= nbytes and _match_frame(d, h, nbytes - i, frame_bytes))
                or (i == 0 and frame_and_padding == nbytes)):
            return i, frame_and_padding
        st[0] = 0
    return nbytes, 0


@njit(cache=True, nogil=True)
def _read_side_info(d, bs, gr, h, o):
    """The Layer III side information into ``gr`` (rows granule * channels + channel); main_data_begin, or -1
    where it is invalid."""
    mono = (h[o + 3] & 0xC0) == 0xC0
    mpeg1 = (h[o + 1] & 0x8) != 0
    gr_count = 1 if mono else 2
    sr_idx = ((h[o + 2] >> 2) & 3) + (((h[o + 1] >> 3) & 1) + ((h[o + 1] >> 4) & 1)) * 3
    if sr_idx != 0:
        sr_idx -= 1
    scfsi = np.int64(0)
    if mpeg1:
        gr_count *= 2
        main_data_begin = _get_bits(d, bs, 9)
        scfsi = _get_bits(d, bs, 7 + gr_count)
    else:
        main_data_begin = _get_bits(d, bs, 8 + gr_count) >> gr_count
    part_23_sum = 0
    for g in range(gr_count):
        if mono:
            scfsi <<= 4
        gr[g, :] = 0
        gr[g, _PART23] = _get_bits(d, bs, 12)
        part_23_sum += gr[g, _PART23]
        gr[g, _BIGV] = _get_bits(d, bs, 9)
        if gr[g, _BIGV] > 288:
            return -1
        gr[g, _GAIN] = _get_bits(d, bs, 8)
        gr[g, _SFC] = _get_bits(d, bs, 4 if mpeg1 else 9)
        gr[g, _SFBROW] = sr_idx
        gr[g, _NLONG] = 22
        if _get_bits(d, bs, 1):
            gr[g, _BTYPE] = _get_bits(d, bs, 2)
            if gr[g, _BTYPE] == 0:
                return -1
            gr[g, _MIXED] = _get_bits(d, bs, 1)
            gr[g, _REGION] = 7
            gr[g, _REGION + 1] = 255
            if gr[g, _BTYPE] == 2:
                scfsi &= 0x0F0F
                if not gr[g, _MIXED]:
                    gr[g, _REGION] = 8
                    gr[g, _SFBROW] = 8 + sr_idx
                    gr[g, _NLONG] = 0
                    gr[g, _NSHORT] = 39
                else:
                    gr[g, _SFBROW] = 16 + sr_idx
                    gr[g, _NLONG] = 8 if mpeg1 else 6
                    gr[g, _NSHORT] = 30
            tables = _get_bits(d, bs, 10) << 5
            for w in range(3):
                gr[g, _SUBGAIN + w] = _get_bits(d, bs, 3)
        else:
            tables = _get_bits(d, bs, 15)
            gr[g, _REGION] = _get_bits(d, bs, 4)
            gr[g, _REGION + 1] = _get_bits(d, bs, 3)
            gr[g, _REGION + 2] = 255
        gr[g, _TABLE] = tables >> 10
        gr[g, _TABLE + 1] = (tables >> 5) & 31
        gr[g, _TABLE + 2] = tables & 31
        gr[g, _PREFLAG] = _get_bits(d, bs, 1) if mpeg1 else (1 if gr[g, _SFC] >= 500 else 0)
        gr[g, _SCALE] = _get_bits(d, bs, 1)
        gr[g, _COUNT1] = _get_bits(d, bs, 1)
        gr[g, _SCFSI] = (scfsi >> 12) & 15
        scfsi <<= 4
    if part_23_sum + bs[0] > bs[1] + main_data_begin * 8:
        return -1
    return main_data_begin


@njit(cache=True, nogil=True)
def _decode_scalefactors(h, ist_pos, md, bs, gr, g, scf, ch, iscf, sizes):
    """Scale factors of granule-channel ``g`` as gains ``scf`` per band; ``ist_pos`` keeps the raw values (MPEG-2:
    the illegal intensity position as 255) for intensity stereo and for MPEG-1's scfsi reuse in granule 1."""
    mpeg1 = (h[1] & 0x8) != 0
    n_long, n_short = gr[g, _NLONG], gr[g, _NSHORT]
    row = (1 if n_short else 0) + (0 if n_long else 1)
    part = 0
    scfsi = gr[g, _SCFSI]
    if mpeg1:
        c = _SCFC_MPEG1[gr[g, _SFC]]
        sizes[0] = sizes[1] = c >> 2
        sizes[2] = sizes[3] = c & 3
    else:
        ist = 1 if (h[3] & 0x10) and ch else 0
        sfc = gr[g, _SFC] >> ist
        k = ist * 12
        while sfc >= 0:
            modprod = 1
            for i in range(3, -1, -1):
                sizes[i] = sfc // modprod % _SCF_MOD[k + i]
                modprod *= _SCF_MOD[k + i]
            sfc -= modprod
            k += 4
        part = k
        scfsi = -16
    at = 0
    for i in range(4):
        cnt = _SCF_PARTITIONS[row, part + i] if part + i < 28 else 0
        if cnt == 0:
            break
        if scfsi & 8:
            for k in range(cnt):
                iscf[at + k] = ist_pos[at + k]
        else:
            bits = sizes[i]
            if bits == 0:
                for k in range(cnt):
                    iscf[at + k] = 0
                    ist_pos[at + k] = 0
            else:
                max_scf = (1 << bits) - 1 if scfsi < 0 else -1
                for k in range(cnt):
                    s = _get_bits(md, bs, bits)
                    ist_pos[at + k] = 255 if s == max_scf else s
                    iscf[at + k] = s
        at += cnt
        scfsi *= 2
    iscf[at] = iscf[at + 1] = iscf[at + 2] = 0
    scf_shift = gr[g, _SCALE] + 1
    if n_short:
        sh = 3 - scf_shift
        for i in range(0, n_short, 3):
            for w in range(3):
                iscf[n_long + i + w] = (iscf[n_long + i + w] + (gr[g, _SUBGAIN + w] << sh)) & 255
    elif gr[g, _PREFLAG]:
        for i in range(10):
            iscf[11 + i] = (iscf[11 + i] + _PREAMP[i]) & 255
    gain_exp = gr[g, _GAIN] - 4 - 210 - (2 if (h[3] & 0xE0) == 0x60 else 0)
    gain = _ldexp_q2(np.float32(1 << 11), 44 - gain_exp)
    for i in range(n_long + n_short):
        scf[i] = _ldexp_q2(gain, iscf[i] << scf_shift)


@njit(cache=True, nogil=True)
def _decode_pair(md, pos, root):
    """A Huffman code from bit ``pos``: (value, new position); no code (tables 0, 4, 14) is 0 in no bits."""
    if root < 0:
        return 0, pos
    node = root
    while True:
        nxt = _TREE[node, _bit(md, pos)]
        pos += 1
        if nxt < 0:
            return -1 - nxt, pos
        node = nxt


@njit(cache=True, nogil=True)
def _huffman(dst, d0, md, pos, gr, g, scf, limit):
    """The granule-channel's 576 dequantised values into ``dst[d0:]`` (zeroed by the caller), from bit ``pos``
    of the main data up to ``limit``: big values pair by pair, then count1 quads while their codes end within the
    limit.  The band widths of each row sum to 576, which bounds every write."""
    big = gr[g, _BIGV]
    row = gr[g, _SFBROW]
    sfb = 0
    d = d0
    one = _F0
    ireg = 0
    while big > 0 and ireg < 3:
        tab = gr[g, _TABLE + ireg]
        sfb_cnt = gr[g, _REGION + ireg]
        ireg += 1
        root = _ROOTS[tab]
        linbits = _LINBITS[tab]
        while True:
            npairs = _SFB[row, sfb] // 2
            sfb += 1
            if npairs == 0:
                return
            pairs = min(big, npairs)
            one = scf[sfb - 1]
            for _ in range(pairs):
                v, pos = _decode_pair(md, pos, root)
                for j in range(2):
                    lsb = (v >> 4) if j == 0 else (v & 15)
                    if linbits and lsb == 15:
                        extra = 0
                        for _b in range(linbits):
                            extra = (extra << 1) | _bit(md, pos)
                            pos += 1
                        lsb += extra
                        sign = _bit(md, pos)
                        dst[d] = one * _pow43(lsb) * (np.float32(-1.0) if sign else _F1)
                    else:
                        dst[d] = _POW43[16 + lsb - 16 * _bit(md, pos)] * one
                    if lsb:
                        pos += 1
                    d += 1
            big -= npairs
            if big <= 0:
                break
            sfb_cnt -= 1
            if sfb_cnt < 0:
                break
    npairs = 1 - big
    root = _ROOTS[33 if gr[g, _COUNT1] else 32]
    while True:
        v, pos = _decode_pair(md, pos, root)
        if pos > limit:
            return
        for half in range(2):
            npairs -= 1
            if npairs == 0:
                npairs = _SFB[row, sfb] // 2
                sfb += 1
                if npairs == 0:
                    return
                one = scf[sfb - 1]
            for j in range(2):
                if v & (8 >> (2 * half + j)):
                    dst[d + j] = -one if _bit(md, pos) else one
                    pos += 1
            d += 2


@njit(cache=True, nogil=True)
def _midside(buf, left, n):
    for i in range(left, left + n):
        a = buf[i]
        b = buf[i + 576]
        buf[i] = a + b
        buf[i + 576] = a - b


@njit(cache=True, nogil=True)
def _intensity_stereo(buf, ist_pos, gr, g, h, max_band):
    """Intensity stereo (with mid/side below it where the header says so) over both channels of ``buf``, the
    bands laid out as granule-channel ``g``'s (the left one); positions from the right channel's ``ist_pos``."""
    row = gr[g, _SFBROW]
    n_sfb = gr[g, _NLONG] + gr[g, _NSHORT]
    max_blocks = 3 if gr[g, _NSHORT] else 1
    mpeg1 = (h[1] & 0x8) != 0
    max_band[0] = max_band[1] = max_band[2] = -1
    at = 576
    for i in range(n_sfb):
        width = _SFB[row, i]
        for k in range(0, width, 2):
            if buf[at + k] != 0 or buf[at + k + 1] != 0:
                max_band[i % 3] = i
                break
        at += width
    if gr[g, _NLONG]:
        top = max(max(max_band[0], max_band[1]), max_band[2])
        max_band[0] = max_band[1] = max_band[2] = top
    for i in range(max_blocks):
        itop = n_sfb - max_blocks + i
        prev = itop - max_blocks
        ist_pos[itop] = (3 if mpeg1 else 0) if max_band[i] >= prev else ist_pos[prev]
    mpeg2_sh = gr[g + 1, _SFC] & 1
    max_pos = 7 if mpeg1 else 64
    ms = (h[3] & 0x20) != 0
    left = 0
    i = 0
    while _SFB[row, i]:
        width = _SFB[row, i]
        ipos = np.int64(ist_pos[i])
        if i > max_band[i % 3] and ipos < max_pos:
            s = _SQRT2 if ms else _F1
            if mpeg1:
                kl = _PAN[2 * ipos]
                kr = _PAN[2 * ipos + 1]
            else:
                kl = _F1
                kr = _ldexp_q2(_F1, ((ipos + 1) >> 1) << mpeg2_sh)
                if ipos & 1:
                    kl = kr
                    kr = _F1
            kl = kl * s
            kr = kr * s
            for j in range(left, left + width):
                buf[j + 576] = buf[j] * kr
                buf[j] = buf[j] * kl
        elif ms:
            _midside(buf, left, width)
        left += width
        i += 1


@njit(cache=True, nogil=True)
def _reorder(buf, start, row, first, tmp):
    """Short-block values from window-major to frequency-major order, from band ``first`` of the row on."""
    src = start
    n = 0
    i = first
    while _SFB[row, i]:
        width = _SFB[row, i]
        for k in range(width):
            tmp[n] = buf[src + k]
            tmp[n + 1] = buf[src + k + width]
            tmp[n + 2] = buf[src + k + 2 * width]
            n += 3
        src += 3 * width
        i += 3
    for k in range(n):
        buf[start + k] = tmp[k]


@njit(cache=True, nogil=True)
def _antialias(buf, start, nbands):
    for b in range(nbands):
        o = start + 18 * b
        for i in range(8):
            u = buf[o + 18 + i]
            d = buf[o + 17 - i]
            buf[o + 18 + i] = u * _ALIAS[0, i] - d * _ALIAS[1, i]
            buf[o + 17 - i] = u * _ALIAS[1, i] + d * _ALIAS[0, i]


@njit(cache=True, nogil=True)
def _dct3_9(y):
    s0, s2, s4, s6, s8 = y[0], y[2], y[4], y[6], y[8]
    t0 = s0 + s6 * _HALF
    s0 = s0 - s6
    t4 = (s4 + s2) * np.float32(0.93969262)
    t2 = (s8 + s2) * np.float32(0.76604444)
    s6 = (s4 - s8) * np.float32(0.17364818)
    s4 = s4 + (s8 - s2)
    s2 = s0 - s4 * _HALF
    y[4] = s4 + s0
    s8 = t0 - t2 + s6
    s0 = t0 - t4 + t2
    s4 = t0 + t4 - s6
    s1, s3, s5, s7 = y[1], y[3], y[5], y[7]
    s3 = s3 * _SQRT3_2
    t0 = (s5 + s1) * np.float32(0.98480775)
    t4 = (s5 - s7) * np.float32(0.34202014)
    t2 = (s1 + s7) * np.float32(0.64278761)
    s1 = (s1 - s5 - s7) * _SQRT3_2
    s5 = t0 - s3 - t2
    s7 = t4 - s3 - t0
    s3 = t4 + s3 - t2
    y[0] = s4 - s7
    y[1] = s2 + s1
    y[2] = s0 - s3
    y[3] = s8 + s5
    y[5] = s8 - s5
    y[6] = s0 + s3
    y[7] = s2 - s1
    y[8] = s4 + s7


@njit(cache=True, nogil=True)
def _imdct36(buf, start, overlap, ov, window, nbands, co, si):
    """18-line IMDCTs of ``nbands`` subbands, windowed with ``_MDCT_WINDOW[window]`` and overlapped."""
    for j in range(nbands):
        g = start + 18 * j
        o = ov + 9 * j
        co[0] = -buf[g]
        si[0] = buf[g + 17]
        for i in range(4):
            si[8 - 2 * i] = buf[g + 4 * i + 1] - buf[g + 4 * i + 2]
            co[1 + 2 * i] = buf[g + 4 * i + 1] + buf[g + 4 * i + 2]
            si[7 - 2 * i] = buf[g + 4 * i + 4] - buf[g + 4 * i + 3]
            co[2 + 2 * i] = -(buf[g + 4 * i + 3] + buf[g + 4 * i + 4])
        _dct3_9(co)
        _dct3_9(si)
        si[1] = -si[1]
        si[3] = -si[3]
        si[5] = -si[5]
        si[7] = -si[7]
        for i in range(9):
            ovl = overlap[o + i]
            s = co[i] * _TWID9[9 + i] + si[i] * _TWID9[i]
            overlap[o + i] = co[i] * _TWID9[i] - si[i] * _TWID9[9 + i]
            buf[g + i] = ovl * _MDCT_WINDOW[window, i] - s * _MDCT_WINDOW[window, 9 + i]
            buf[g + 17 - i] = ovl * _MDCT_WINDOW[window, 9 + i] + s * _MDCT_WINDOW[window, i]


@njit(cache=True, nogil=True)
def _idct3(x0, x1, x2, dst):
    m1 = x1 * _SQRT3_2
    a1 = x0 - x2 * _HALF
    dst[1] = x0 + x2
    dst[0] = a1 + m1
    dst[2] = a1 - m1


@njit(cache=True, nogil=True)
def _imdct12(x, xo, dst, do, overlap, oo, co, si):
    _idct3(-x[xo], x[xo + 6] + x[xo + 3], x[xo + 12] + x[xo + 9], co)
    _idct3(x[xo + 15], x[xo + 12] - x[xo + 9], x[xo + 6] - x[xo + 3], si)
    si[1] = -si[1]
    for i in range(3):
        ovl = overlap[oo + i]
        s = co[i] * _TWID3[3 + i] + si[i] * _TWID3[i]
        overlap[oo + i] = co[i] * _TWID3[i] - si[i] * _TWID3[3 + i]
        dst[do + i] = ovl * _TWID3[2 - i] - s * _TWID3[5 - i]
        dst[do + 5 - i] = ovl * _TWID3[5 - i] + s * _TWID3[2 - i]


@njit(cache=True, nogil=True)
def _imdct_short(buf, start, overlap, ov, nbands, tmp, co, si):
    for b in range(nbands):
        g = start + 18 * b
        o = ov + 9 * b
        for k in range(18):
            tmp[k] = buf[g + k]
        for k in range(6):
            buf[g + k] = overlap[o + k]
        _imdct12(tmp, 0, buf, g + 6, overlap, o + 6, co, si)
        _imdct12(tmp, 1, buf, g + 12, overlap, o + 6, co, si)
        _imdct12(tmp, 2, overlap, o, overlap, o + 6, co, si)


@njit(cache=True, nogil=True)
def _imdct_granule(buf, start, overlap, ov, block_type, n_long_bands, tmp, co, si):
    if n_long_bands:
        _imdct36(buf, start, overlap, ov, 0, n_long_bands, co, si)
    rest_buf = start + 18 * n_long_bands
    rest_ov = ov + 9 * n_long_bands
    if block_type == 2:
        _imdct_short(buf, rest_buf, overlap, rest_ov, 32 - n_long_bands, tmp, co, si)
    else:
        _imdct36(buf, rest_buf, overlap, rest_ov, 1 if block_type == 3 else 0, 32 - n_long_bands, co, si)
    # frequency inversion: odd samples of odd subbands
    for b in range(1, 32, 2):
        for i in range(1, 18, 2):
            buf[start + 18 * b + i] = -buf[start + 18 * b + i]


@njit(cache=True, nogil=True)
def _decode_granule(h, md, bs, gr, g0, nch, buf, scf, ist_pos, overlap, work, iscf, sizes, max_band):
    """One granule: scale factors, Huffman, stereo, reorder, alias reduction, IMDCT of each channel into ``buf``
    (channel c at 576 c)."""
    for ch in range(nch):
        limit = bs[0] + gr[g0 + ch, _PART23]
        _decode_scalefactors(h, ist_pos[ch], md, bs, gr, g0 + ch, scf, ch, iscf, sizes)
        _huffman(buf, 576 * ch, md, bs[0], gr, g0 + ch, scf, limit)
        bs[0] = limit
    if h[3] & 0x10:
        _intensity_stereo(buf, ist_pos[1], gr, g0, h, max_band)
    elif (h[3] & 0xE0) == 0x60:
        _midside(buf, 0, 576)
    tmp, co, si = work[:576], work[576:585], work[585:594]
    rate_8k = (h[1] & 0x18) == 0 and ((h[2] >> 2) & 3) == 2  # MPEG-2.5 at 8 kHz: mixed blocks open with 4 subbands
    for ch in range(nch):
        g = g0 + ch
        n_long_bands = (2 if gr[g, _MIXED] else 0) << (1 if rate_8k else 0)
        aa_bands = 31
        if gr[g, _NSHORT]:
            aa_bands = n_long_bands - 1
            _reorder(buf, 576 * ch + 18 * n_long_bands, gr[g, _SFBROW], gr[g, _NLONG], tmp)
        _antialias(buf, 576 * ch, aa_bands)
        _imdct_granule(buf, 576 * ch, overlap, 288 * ch, gr[g, _BTYPE], n_long_bands, tmp, co, si)


@njit(cache=True, nogil=True)
def _dct_ii(buf, start, n, t):
    """The 32-point DCT-II of the polyphase filter bank over columns 0..n-1 of the channel's 32 x 18 subband
    samples, in place; the closing sums in the order of minimp3's SSE code."""
    for k in range(n):
        y = start + k
        for i in range(8):
            x0 = buf[y + i * 18]
            x1 = buf[y + (15 - i) * 18]
            x2 = buf[y + (16 + i) * 18]
            x3 = buf[y + (31 - i) * 18]
            t0 = x0 + x3
            t1 = x1 + x2
            t2 = (x1 - x2) * _SEC[3 * i]
            t3 = (x0 - x3) * _SEC[3 * i + 1]
            t[i] = t0 + t1
            t[8 + i] = (t0 - t1) * _SEC[3 * i + 2]
            t[16 + i] = t3 + t2
            t[24 + i] = (t3 - t2) * _SEC[3 * i + 2]
        for r in range(0, 32, 8):
            x0, x1, x2, x3 = t[r], t[r + 1], t[r + 2], t[r + 3]
            x4, x5, x6, x7 = t[r + 4], t[r + 5], t[r + 6], t[r + 7]
            xt = x0 - x7
            x0 = x0 + x7
            x7 = x1 - x6
            x1 = x1 + x6
            x6 = x2 - x5
            x2 = x2 + x5
            x5 = x3 - x4
            x3 = x3 + x4
            x4 = x0 - x3
            x0 = x0 + x3
            x3 = x1 - x2
            x1 = x1 + x2
            t[r] = x0 + x1
            t[r + 4] = (x0 - x1) * np.float32(0.70710677)
            x5 = x5 + x6
            x6 = (x6 + x7) * np.float32(0.70710677)
            x7 = x7 + xt
            x3 = (x3 + x4) * np.float32(0.70710677)
            x5 = x5 - x7 * np.float32(0.198912367)  # rotate by pi/8
            x7 = x7 + x5 * np.float32(0.382683432)
            x5 = x5 - x7 * np.float32(0.198912367)
            x0 = xt - x6
            xt = xt + x6
            t[r + 1] = (xt + x7) * np.float32(0.50979561)
            t[r + 2] = (x4 + x3) * np.float32(0.54119611)
            t[r + 3] = (x0 - x5) * np.float32(0.60134488)
            t[r + 5] = (x0 + x5) * np.float32(0.89997619)
            t[r + 6] = (x4 - x3) * np.float32(1.30656302)
            t[r + 7] = (xt - x7) * np.float32(2.56291556)
        for i in range(7):
            s = t[24 + i] + t[24 + i + 1]
            buf[y] = t[i]
            buf[y + 18] = t[16 + i] + s
            buf[y + 36] = t[8 + i] + t[8 + i + 1]
            buf[y + 54] = t[16 + i + 1] + s
            y += 72
        buf[y] = t[7]
        buf[y + 18] = t[23] + t[31]
        buf[y + 36] = t[15]
        buf[y + 54] = t[31]


@njit(cache=True, nogil=True)
def _synth_pair(pcm, p, nch, z, o):
    a = (z[o + 14 * 64] - z[o]) * np.float32(29.0)
    a += (z[o + 1 * 64] + z[o + 13 * 64]) * np.float32(213.0)
    a += (z[o + 12 * 64] - z[o + 2 * 64]) * np.float32(459.0)
    a += (z[o + 3 * 64] + z[o + 11 * 64]) * np.float32(2037.0)
    a += (z[o + 10 * 64] - z[o + 4 * 64]) * np.float32(5153.0)
    a += (z[o + 5 * 64] + z[o + 9 * 64]) * np.float32(6574.0)
    a += (z[o + 8 * 64] - z[o + 6 * 64]) * np.float32(37489.0)
    a += z[o + 7 * 64] * np.float32(75038.0)
    pcm[p] = a * _SCALE_OUT
    o += 2
    a = z[o + 14 * 64] * np.float32(104.0)
    a += z[o + 12 * 64] * np.float32(1567.0)
    a += z[o + 10 * 64] * np.float32(9727.0)
    a += z[o + 8 * 64] * np.float32(64019.0)
    a += z[o + 6 * 64] * np.float32(-9975.0)
    a += z[o + 4 * 64] * np.float32(-45.0)
    a += z[o + 2 * 64] * np.float32(146.0)
    a += z[o + 0 * 64] * np.float32(-5.0)
    pcm[p + 16 * nch] = a * _SCALE_OUT


@njit(cache=True, nogil=True)
def _synth(buf, xl, nch, pcm, dstl, lins, lo, acc):
    """64 output samples per channel from subband columns ``xl`` and ``xl + 1``; ``lins`` holds the filter
    history, four lanes (left even, right even, left odd, right odd) per slot.  Mono runs its right lanes on the
    left's samples and writes the left's last, as minimp3 does."""
    xr = xl + 576 * (nch - 1)
    dstr = dstl + (nch - 1)
    z = lo + 15 * 64
    lins[z + 60] = buf[xl + 18 * 16]
    lins[z + 61] = buf[xr + 18 * 16]
    lins[z + 62] = buf[xl]
    lins[z + 63] = buf[xr]
    lins[z + 124] = buf[xl + 1 + 18 * 16]
    lins[z + 125] = buf[xr + 1 + 18 * 16]
    lins[z + 126] = buf[xl + 1]
    lins[z + 127] = buf[xr + 1]
    _synth_pair(pcm, dstr, nch, lins, lo + 61)
    _synth_pair(pcm, dstr + 32 * nch, nch, lins, lo + 61 + 64)
    _synth_pair(pcm, dstl, nch, lins, lo + 60)
    _synth_pair(pcm, dstl + 32 * nch, nch, lins, lo + 60 + 64)
    for i in range(14, -1, -1):
        zi = z + 4 * i
        lins[zi] = buf[xl + 18 * (31 - i)]
        lins[zi + 1] = buf[xr + 18 * (31 - i)]
        lins[zi + 2] = buf[xl + 1 + 18 * (31 - i)]
        lins[zi + 3] = buf[xr + 1 + 18 * (31 - i)]
        lins[zi + 64] = buf[xl + 1 + 18 * (1 + i)]
        lins[zi + 65] = buf[xr + 1 + 18 * (1 + i)]
        lins[zi - 62] = buf[xl + 18 * (1 + i)]
        lins[zi - 61] = buf[xr + 18 * (1 + i)]
        w = (14 - i) * 16
        for k in range(8):
            w0 = _SYNTH_WINDOW[w + 2 * k]
            w1 = _SYNTH_WINDOW[w + 2 * k + 1]
            vz = zi - 64 * k
            vy = zi - 64 * (15 - k)
            for j in range(4):
                zz = lins[vz + j]
                yy = lins[vy + j]
                b = zz * w1 + yy * w0
                if k == 0:
                    acc[4 + j] = b
                    acc[j] = zz * w0 - yy * w1
                elif k & 1:
                    acc[4 + j] = acc[4 + j] + b
                    acc[j] = acc[j] + (yy * w1 - zz * w0)
                else:
                    acc[4 + j] = acc[4 + j] + b
                    acc[j] = acc[j] + (zz * w0 - yy * w1)
        pcm[dstr + (15 - i) * nch] = acc[1] * _SCALE_OUT
        pcm[dstr + (17 + i) * nch] = acc[5] * _SCALE_OUT
        pcm[dstl + (15 - i) * nch] = acc[0] * _SCALE_OUT
        pcm[dstl + (17 + i) * nch] = acc[4] * _SCALE_OUT
        pcm[dstr + (47 - i) * nch] = acc[3] * _SCALE_OUT
        pcm[dstr + (49 + i) * nch] = acc[7] * _SCALE_OUT
        pcm[dstl + (47 - i) * nch] = acc[2] * _SCALE_OUT
        pcm[dstl + (49 + i) * nch] = acc[6] * _SCALE_OUT


@njit(cache=True, nogil=True)
def _synth_granule(qmf, buf, nbands, nch, pcm, p, lins, work):
    """Polyphase synthesis of ``nbands`` (18) columns of each channel into ``pcm[p:]``, interleaved."""
    for ch in range(nch):
        _dct_ii(buf, 576 * ch, nbands, work)
    lins[:960] = qmf
    for i in range(0, nbands, 2):
        _synth(buf, i, nch, pcm, p + 32 * nch * i, lins, i * 64, work[32:40])
    if nch == 1:  # minimp3 keeps only the left lanes' history for mono
        for i in range(0, 960, 2):
            qmf[i] = lins[nbands * 64 + i]
    else:
        qmf[:] = lins[nbands * 64:nbands * 64 + 960]


@njit(cache=True, nogil=True)
def _decode_frame(d, o, nbytes, dec, hdr, reserv_buf, overlap, qmf, md, gr, buf, scf, ist_pos, lins, work,
                  iscf, sizes, max_band, pcm):
    """minimp3's ``decode_frame`` on ``d[o:o + nbytes]``: (samples per channel or 0, bytes consumed, channels,
    rate, layer).  Decoder state: ``hdr`` (the last header, ``hdr[0] != 0xFF`` when none), ``dec`` (free-format
    frame size, reservoir bytes), ``reserv_buf``, ``overlap``, ``qmf``.  Layers I and II are not decoded (0
    samples, their layer reported)."""
    i = 0
    frame_size = 0
    if nbytes > 4 and hdr[0] == 0xFF and _hdr_compare(hdr, 0, d, o):
        frame_size = _hdr_frame_bytes(d, o, dec[0]) + _hdr_padding(d, o)
        if frame_size != nbytes and (frame_size + 4 > nbytes or not _hdr_compare(d, o, d, o + frame_size)):
            frame_size = 0
    if frame_size == 0:
        hdr[:] = 0
        dec[:] = 0
        overlap[:] = 0
        qmf[:] = 0
        i, frame_size = _find_frame(d, o, nbytes, dec)
        if frame_size == 0 or i + frame_size > nbytes:
            return 0, i, 0, 0, 0
    h = o + i
    hdr[:] = d[h:h + 4]
    consumed = i + frame_size
    nch = 1 if (hdr[3] & 0xC0) == 0xC0 else 2
    hz = _hdr_hz(hdr, 0)
    layer = 4 - ((hdr[1] >> 1) & 3)
    if layer != 3:
        return 0, consumed, nch, hz, layer
    bs = np.zeros(3, np.int64)
    bs[1] = (frame_size - 4) * 8
    bs[2] = h + 4
    if not hdr[1] & 1:  # CRC, not checked
        _get_bits(d, bs, 16)
    main_data_begin = _read_side_info(d, bs, gr, hdr, 0)
    if main_data_begin < 0 or bs[0] > bs[1]:
        hdr[0] = 0
        return 0, consumed, nch, hz, layer
    # the bit reservoir: main_data_begin bytes kept from earlier frames, then this frame's main data
    frame_bytes = (bs[1] - bs[0]) // 8
    have = min(dec[1], main_data_begin)
    start = max(0, dec[1] - main_data_begin)
    md[:have] = reserv_buf[start:start + have]
    md[have:have + frame_bytes] = d[bs[2] + bs[0] // 8:bs[2] + bs[0] // 8 + frame_bytes]
    mbs = np.zeros(3, np.int64)
    mbs[1] = (have + frame_bytes) * 8
    success = dec[1] >= main_data_begin
    samples = 0
    if success:
        mpeg1 = (hdr[1] & 0x8) != 0
        ngr = 2 if mpeg1 else 1
        for igr in range(ngr):
            buf[:2 * 576] = 0
            _decode_granule(hdr, md, mbs, gr, igr * nch, nch, buf, scf, ist_pos, overlap, work, iscf, sizes,
                            max_band)
            _synth_granule(qmf, buf, 18, nch, pcm, igr * 576 * nch, lins, work)
        samples = 576 * ngr
    # keep the last (at most 511) bytes after what was read as the next frames' reservoir
    pos = (mbs[0] + 7) // 8
    remains = mbs[1] // 8 - pos
    if remains > _RESERVOIR:
        pos += remains - _RESERVOIR
        remains = _RESERVOIR
    if remains > 0:
        reserv_buf[:remains] = md[pos:pos + remains]
    dec[1] = max(remains, 0)
    return samples, consumed, nch, hz, layer


@njit(cache=True, nogil=True)
def _decode_stream(d):
    """All frames of ``d`` as ``drmp3_read_pcm_frames_f32`` returns them, read in onnxruntime-extensions' chunks:
    (interleaved float32 samples, frames, channels, rate, status): status 0, 1 no frame decoded, 2 a Layer I/II
    frame.  A frame whose channel count is not the stream's is copied as dr_mp3 copies it: the stream's count of
    samples per frame, from where the frame's own layout puts the frame (so partly the previous frame's)."""
    nbytes = d.shape[0]
    dec = np.zeros(2, np.int64)
    hdr = np.zeros(4, np.uint8)
    reserv_buf = np.zeros(_RESERVOIR, np.uint8)
    overlap = np.zeros(2 * 288, np.float32)
    qmf = np.zeros(15 * 64, np.float32)
    md = np.zeros(_RESERVOIR + _MAX_FRAME + 8, np.uint8)
    gr = np.zeros((4, _NFIELDS), np.int64)
    # both channels' spectra, then the band gains, adjacent as minimp3 lays them out: at 8 kHz its mixed-block
    # reordering runs 24 values past a channel (into the next one, or from channel 1 into the gains)
    buf = np.zeros(2 * 576 + 40, np.float32)
    scf = buf[2 * 576:]
    ist_pos = np.zeros((2, 40), np.uint8)
    lins = np.zeros(33 * 64, np.float32)
    work = np.zeros(600, np.float32)
    iscf = np.zeros(48, np.int64)
    sizes = np.zeros(4, np.int64)
    max_band = np.zeros(3, np.int64)
    pcm = np.zeros(2 * 1152, np.float32)
    out = np.empty(max(4096, nbytes * 16), np.float32)
    filled = 0
    frames = 0
    channels = 0
    rate = 0
    pos = 0
    while pos < nbytes:
        samples, consumed, nch, hz, layer = _decode_frame(d, pos, nbytes - pos, dec, hdr, reserv_buf, overlap, qmf,
                                                          md, gr, buf, scf, ist_pos, lins, work, iscf, sizes,
                                                          max_band, pcm)
        if consumed == 0:
            break
        pos += consumed
        if layer != 0 and layer != 3:
            return out[:0], 0, nch, hz, 2
        if samples == 0:
            continue
        if channels == 0:
            channels, rate = nch, hz
        if filled + samples * channels > out.shape[0]:
            grown = np.empty(2 * (filled + samples * channels), np.float32)
            grown[:filled] = out[:filled]
            out = grown
        done = 0
        while done < samples:  # a chunk boundary inside a frame restarts the copy at the frame's own stride
            take = min(samples - done, _CHUNK_FRAMES - frames % _CHUNK_FRAMES)
            out[filled:filled + take * channels] = pcm[done * nch:done * nch + take * channels]
            filled += take * channels
            frames += take
            done += take
    if channels == 0:
        return out[:0], 0, 0, 0, 1
    return out[:filled], frames, channels, rate, 0


def decode_mp3(data: bytes) -> tuple:
    """(float32 samples ``[frames, channels]``, sample rate) of an MP3 clip, as onnxruntime-extensions'
    ``AudioDecoder`` reads it (see the module docstring)."""
    if not is_mp3(data):
        raise MP3DecodeError("MP3: the data does not begin with an MPEG audio frame sync (0xFF 0xE0 mask); "
                             "onnxruntime-extensions reads MP3 only so (a leading ID3 tag is not skipped)")
    pcm, frames, channels, rate, status = _decode_stream(np.frombuffer(data, np.uint8))
    if status == 1:
        raise MP3DecodeError("MP3: no decodable MPEG audio frame found")
    if status == 2:
        raise NotImplementedError("MP3: MPEG audio Layer I/II frames are not decoded here (Layer III is)")
    return pcm.reshape(frames, channels), int(rate)
