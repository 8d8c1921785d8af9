"""Text <-> token ids for a GenAI package, after onnxruntime-genai's ``Tokenizer`` and ``TokenizerStream``.

``Tokenizer(folder)`` loads ``folder/tokenizer.json`` with the ``tokenizers`` library (a path to the json file
itself is accepted too); an added token keeps the id the file declares, as in onnxruntime-genai (``tokenizers``
renumbers one declared past the vocabulary).  As onnxruntime-genai's tokenizer, ``encode`` adds no special token
and ``decode`` skips them, unless ``update_options(add_special_tokens=..., skip_special_tokens=...)`` says
otherwise.  With ``add_special_tokens`` on, special tokens are added the way the tokenizer's own
post-processor says, and where ``tokenizer_config.json`` asks for ``add_bos_token`` / ``add_eos_token`` and the
post-processor did not already add that token it is added here (Hugging Face's rule; onnxruntime-genai's
tokenizer may add an EOS more).

Bytes that are not UTF-8 are handled as onnxruntime-extensions handles them (its ``ValidateUTF8``: overlong forms,
surrogates, U+FFFE/U+FFFF and code points past U+10FFFF are invalid too): ``decode_genai`` (``og.Tokenizer.decode``
and the processors' ``decode``) keeps the text up to the
first invalid byte and ends it with one U+FFFD, and text is cut at a NUL character, as onnxruntime-genai's C strings
cut it (a NUL first reads as invalid: U+FFFD); a stream of a byte-level tokenizer collects each token's bytes,
takes them a character at a time by the lead byte's length, and drops a character that is not valid (with the
bytes the length covers, an ASCII one included) and a NUL; an incomplete one waits for the next token.

``Tokenizer.create_stream()`` gives a ``TokenizerStream`` whose
``decode(token_id)`` returns only the text completed by that token.
Invariants of the stream of any other tokenizer:
- the concatenation of everything it returned equals ``decode`` of all the
  ids it was fed, once the last character is complete;
- a character split over several tokens (UTF-8 bytes in byte-level BPE)
  is returned whole by the token that completes it; until then the stream
  returns ``""`` (after 4 tokens it gives up waiting: a token may decode to
  U+FFFD on its own);
- it decodes a sliding window (the previous step's tokens plus the new ones),
  so its cost per token does not grow with the length of the text, and
  decoders that strip a leading space from the first token (Metaspace) do
  not lose the spaces between tokens.
"""
from __future__ import annotations

import json
import os

import numpy as np

from .spec import IncompletePackageError

__all__ = ["Tokenizer", "TokenizerStream", "token_text"]

_REPLACEMENT = "\ufffd"
_MAX_PENDING = 4  # tokens a stream waits for a character to complete (a UTF-8 character has at most 4 bytes)
_UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)  # a character's length by its first byte's high nibble


def _utf8_char_valid(c: bytes) -> bool:
    """Whether ``c``, one character's bytes by its lead byte, is valid UTF-8 to onnxruntime-extensions."""
    b0 = c[0]
    if b0 < 0x80:
        return b0 != 0  # its validation stops at a NUL, having validated nothing
    if any(x & 0xC0 != 0x80 for x in c[1:]):
        return False
    if b0 & 0xE0 == 0xC0:
        return b0 & 0xFE != 0xC0  # overlong
    if b0 & 0xF0 == 0xE0:
        return not ((b0 == 0xE0 and c[1] & 0xE0 == 0x80) or (b0 == 0xED and c[1] & 0xE0 == 0xA0)
                    or (b0 == 0xEF and c[1] == 0xBF and c[2] & 0xFE == 0xBE))  # overlong, surrogate, U+FFFE/F
    if b0 & 0xF8 == 0xF0:
        return not ((b0 == 0xF0 and c[1] & 0xF0 == 0x80) or (b0 == 0xF4 and c[1] > 0x8F) or b0 > 0xF4)
    return False  # a continuation byte or 0xF8..0xFF first


def _c_string(text: str) -> str:
    """``text`` as onnxruntime-genai hands it back, through a C string: up to its first NUL."""
    nul = text.find("\x00")
    return text if nul < 0 else text[:nul]


def _byte_decoder() -> dict:
    """Byte-level BPE's characters -> the bytes they stand for (GPT-2's table)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def token_text(value):
    """The text of a ``bos_token``-style entry of tokenizer_config.json (a string or an AddedToken dict)."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """A ``tokenizers.Tokenizer`` with onnxruntime-genai's calling conventions (int64 numpy ids)."""

    def __init__(self, path: str):
        import tokenizers  # imported here so that the rest of pipeline/ loads without it

        path = os.fspath(path)
        if os.path.isdir(path):
            folder, file = path, os.path.join(path, "tokenizer.json")
        else:
            folder, file = os.path.dirname(path) or ".", path
        if not os.path.isfile(file):
            raise FileNotFoundError(f"no tokenizer.json at {file!r}: the package needs a tokenizers-format "
                                    f"tokenizer.json next to its genai_config.json")
        try:
            self._tok = tokenizers.Tokenizer.from_file(file)
        except Exception as exc:  # the tokenizers library raises a bare Exception on malformed files
            raise IncompletePackageError(f"cannot read tokenizer {file!r}: {exc}") from exc
        self.path = file
        # tokenizers renumbers an added token whose declared id lies past the vocabulary (after the last entry);
        # onnxruntime-genai's tokenizer keeps the declared id, so ids are translated both ways where they differ
        # (only an added token outside the model's vocabulary can have been renumbered: else the file is not read)
        decoder = self._tok.get_added_tokens_decoder()
        added = []
        if decoder and max(decoder) >= self._tok.get_vocab_size(with_added_tokens=False):
            with open(file, encoding="utf-8") as f:
                added = json.load(f).get("added_tokens") or []
        self._declared = {}  # tokenizers' id -> tokenizer.json's
        for t in added:
            own = self._tok.token_to_id(t.get("content", "")) if isinstance(t, dict) else None
            if own is not None and isinstance(t.get("id"), int) and own != t["id"]:
                self._declared[own] = t["id"]
        self._own = {v: k for k, v in self._declared.items()}
        self.config = {}
        cfg = os.path.join(folder, "tokenizer_config.json")
        if os.path.isfile(cfg):
            with open(cfg, encoding="utf-8") as f:
                self.config = json.load(f)
        self.bos_token_id = self._config_token_id("bos_token")
        self.eos_token_id = self._config_token_id("eos_token")
        self.pad_token_id = self._config_token_id("pad_token")
        self._add_bos = bool(self.config.get("add_bos_token", False)) and self.bos_token_id is not None
        self._add_eos = bool(self.config.get("add_eos_token", False)) and self.eos_token_id is not None
        self.add_special_tokens = False  # onnxruntime-genai's defaults
        self.skip_special_tokens = True

    def update_options(self, **options):
        """onnxruntime-genai's tokenizer options ``add_special_tokens`` and ``skip_special_tokens`` (``"true"`` /
        ``"false"`` or a bool); another key is a ``RuntimeError`` naming it."""
        for key, value in options.items():
            if key not in ("add_special_tokens", "skip_special_tokens"):
                raise RuntimeError(f"Invalid tokenizer option key: {key}")
            if isinstance(value, str) and value.lower() in ("true", "false"):
                value = value.lower() == "true"
            if not isinstance(value, bool):
                raise RuntimeError(f"Invalid tokenizer option value for {key}: {value!r} (expected true or false)")
            setattr(self, key, value)

    def _config_token_id(self, key):
        text = token_text(self.config.get(key))
        return None if text is None else self.token_to_id(text)

    def _out(self, ids) -> list:
        """tokenizers' ids as tokenizer.json declares them."""
        return [self._declared.get(i, i) for i in ids] if self._declared else list(ids)

    def _in(self, ids) -> list:
        """Declared ids as tokenizers numbers them."""
        return [self._own.get(int(i), int(i)) for i in ids] if self._own else [int(i) for i in ids]

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str):
        t = self._tok.token_to_id(token)
        return self._declared.get(t, t)

    def id_to_token(self, token_id: int):
        return self._tok.id_to_token(self._own.get(int(token_id), int(token_id)))

    def _finish(self, ids: list) -> np.ndarray:
        if self._add_bos and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id] + ids
        if self._add_eos and (not ids or ids[-1] != self.eos_token_id):
            ids = ids + [self.eos_token_id]
        return np.asarray(ids, dtype=np.int64)

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int64 [n]) of ``text``; special tokens only with ``add_special_tokens`` (see above)."""
        if not isinstance(text, str):
            raise TypeError(f"Tokenizer.encode expects a str, got {type(text).__name__}")
        if not self.add_special_tokens:
            return np.asarray(self._out(self._tok.encode(text, add_special_tokens=False).ids), np.int64)
        return self._finish(self._out(self._tok.encode(text, add_special_tokens=True).ids))

    def encode_batch(self, texts) -> list:
        """``encode`` of each text, as a list of int64 arrays (lengths differ; no padding)."""
        if not self.add_special_tokens:
            return [np.asarray(self._out(e.ids), np.int64)
                    for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]
        return [self._finish(self._out(e.ids)) for e in self._tok.encode_batch(list(texts), add_special_tokens=True)]

    def decode(self, ids) -> str:
        """Text of ``ids`` (any integer sequence or array), special tokens skipped unless ``skip_special_tokens``
        is off; bytes that are not UTF-8 each become U+FFFD (the ``tokenizers`` library's text, which the server's
        windows of ids rely on)."""
        seq = np.asarray(ids).reshape(-1).tolist()
        return self._tok.decode(self._in(seq), skip_special_tokens=self.skip_special_tokens)

    def decode_genai(self, ids) -> str:
        """``decode`` as onnxruntime-genai's ``Tokenizer.decode`` gives it: cut after the first character that is
        not valid UTF-8, which becomes U+FFFD, and at a NUL (see above)."""
        text = self.decode(ids)
        bad = text.find(_REPLACEMENT)
        text = text if bad < 0 else text[:bad + 1]
        return _REPLACEMENT if text[:1] == "\x00" else _c_string(text)  # nothing valid before a NUL: invalid

    def byte_level(self) -> bool:
        """Whether the tokenizer's decoder is byte-level BPE's (a token's characters stand for bytes)."""
        import tokenizers
        return isinstance(self._tok.decoder, tokenizers.decoders.ByteLevel)

    def create_stream(self) -> "TokenizerStream":
        return TokenizerStream(self)


class TokenizerStream:
    """Incremental detokenizer: ``decode(token_id)`` returns the text that token completes."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer._tok
        self._own = tokenizer._own
        self._skip = tokenizer.skip_special_tokens
        self._bytes = _byte_decoder() if tokenizer.byte_level() else None
        self._added = self._tok.get_added_tokens_decoder()
        self.reset()

    def reset(self):
        """Forget the tokens fed so far (start of a new sequence)."""
        self._ids = []
        self._prefix = 0  # start of the decode window
        self._read = 0    # tokens before this index have had their text returned
        self._pending = b""  # a byte-level stream's bytes of a character not yet complete

    def _token_bytes(self, tid: int):
        """A byte-level token's bytes (None: a special token the stream skips)."""
        added = self._added.get(tid)
        if added is not None:
            return None if added.special and self._skip else added.content.encode()
        text = self._tok.id_to_token(tid)
        if text is None:
            return None
        return b"".join(bytes([self._bytes[ch]]) if ch in self._bytes else ch.encode() for ch in text)

    def decode(self, token_id) -> str:
        tid = self._own.get(int(token_id), int(token_id))
        if self._bytes is not None:
            b = self._token_bytes(tid)
            if b is None:
                return ""
            buf, out, i = self._pending + b, bytearray(), 0
            while i < len(buf):
                n = _UTF8_LEN[buf[i] >> 4]
                if n > len(buf) - i:
                    break
                if _utf8_char_valid(buf[i:i + n]):
                    out += buf[i:i + n]
                i += n
            self._pending = buf[i:]
            return out.decode("utf-8")
        self._ids.append(tid)
        prefix_text = self._tok.decode(self._ids[self._prefix:self._read], skip_special_tokens=self._skip)
        text = self._tok.decode(self._ids[self._prefix:], skip_special_tokens=self._skip)
        pending = len(self._ids) - self._read
        if pending < _MAX_PENDING and (len(text) <= len(prefix_text) or text.endswith(_REPLACEMENT)):
            return ""  # nothing new (a skipped special token) or the last character is not complete yet
        out = text[len(prefix_text):]
        self._prefix = self._read
        self._read = len(self._ids)
        return out
