"""Digest records of external-data files: damage that no check of the values can see.

A float weight overwritten by random bytes holds a NaN (the loader's scan finds it), but packed integer weights
(int4 and int8 codes) and zeros written over floats do not: every byte value is a valid weight.  A record taken
while a model is known to be good catches them.  It sits beside the data file as ``<file>.digests.json``
(JSON: the file's size, the chunk size, the CRC-32 of each chunk), is written by ``record`` (``python -m
pipeline warm PACKAGE`` and ``python -m runtime.digests MODEL.onnx`` call it), and the loader checks every chunk
a tensor spans the first time it maps that tensor.

Invariants:
- No record, no check and no cost: models built elsewhere carry none.
- Each chunk is checked at most once per load, before any kernel reads the tensor; a mismatch is
  ``ExternalDataDamagedError`` naming the tensor, the byte range and the file.  A file whose size differs from
  the record's is refused the same way (truncated, or grown).
- A record that cannot be written (a read-only folder) is a warning, never a failure; a record that cannot be
  read (not JSON, wrong fields) is a warning and the file loads unchecked.
- ``ONNX_NUMBA_CHECK_WEIGHTS=0`` skips the check, as it skips the NaN scan.
"""
from __future__ import annotations

import json
import os
import sys
import warnings
import zlib

from .atomic import write_atomic
from .errors import ExternalDataDamagedError

__all__ = ["record", "record_file", "FileDigests", "SUFFIX", "CHUNK"]

SUFFIX = ".digests.json"
CHUNK = 4 << 20  # bytes per digest: the error names a range this wide; the record holds 1 KB per 256 MB
_FORMAT = 1


def _crcs(buf, chunk: int) -> list:
    view = memoryview(buf)
    return [zlib.crc32(view[i:i + chunk]) for i in range(0, len(view), chunk)]


def record_file(path: str, chunk: int = CHUNK) -> str | None:
    """Write the record of data file ``path`` beside it; returns the record's path, or None (with a warning)
    when the folder cannot be written."""
    import mmap
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                crcs = _crcs(m, chunk)
        else:
            crcs = []
    body = {"format": _FORMAT, "file": os.path.basename(path), "size": size, "chunk": chunk, "crc32": crcs}
    out = path + SUFFIX
    try:
        write_atomic(out, json.dumps(body))  # a reader sees the old record or the new one
    except OSError as e:
        warnings.warn(f"could not write the digest record of {path!r} ({e}); its weights load unchecked",
                      RuntimeWarning, stacklevel=2)
        return None
    return out


def record(model_path: str, chunk: int = CHUNK) -> list:
    """Write the record of every external-data file that the model at ``model_path`` reads, one CRC-32 per
    ``chunk`` bytes; returns the records written.  Locations are resolved (and refused) as the loader resolves
    them."""
    from onnx import TensorProto
    from .loader import _tensors_of, load_model_proto, resolve_external_path
    proto, base_dir = load_model_proto(model_path)
    files = []
    for t in _tensors_of(proto.graph):
        if t.data_location == TensorProto.EXTERNAL:
            location = {e.key: e.value for e in t.external_data}.get("location", "")
            full = resolve_external_path(base_dir, location)
            if full not in files:
                files.append(full)
    return [r for r in (record_file(f, chunk) for f in files) if r is not None]


class FileDigests:
    """The record of one data file, checked chunk by chunk as tensors are mapped (``check``)."""

    def __init__(self, path: str, location: str, body: dict):
        self.path, self.location = path, location
        self.size, self.chunk, self.crcs = body["size"], body["chunk"], body["crc32"]
        self.checked: set = set()

    @classmethod
    def load(cls, path: str, location: str) -> "FileDigests | None":
        """The record beside ``path``, or None when there is none (or it cannot be read: a warning)."""
        rec = path + SUFFIX
        if not os.path.isfile(rec):
            return None
        try:
            with open(rec) as f:
                body = json.load(f)
            ok = (body.get("format") == _FORMAT and isinstance(body.get("size"), int)
                  and isinstance(body.get("chunk"), int) and body["chunk"] > 0
                  and isinstance(body.get("crc32"), list)
                  and len(body["crc32"]) == -(-body["size"] // body["chunk"]))
        except (OSError, ValueError, AttributeError) as e:
            ok, body = False, str(e)
        if not ok:
            warnings.warn(f"the digest record {rec!r} cannot be read; {location!r} loads unchecked", RuntimeWarning,
                          stacklevel=3)
            return None
        return cls(path, location, body)

    def check(self, data, offset: int, length: int, tensor: str) -> None:
        """Refuse ``tensor`` (bytes [offset, offset+length) of the file ``data`` maps) when a chunk it spans
        differs from the record."""
        if len(data) != self.size:
            raise ExternalDataDamagedError(
                f"tensor {tensor!r}: {self.location!r} holds {len(data)} bytes, but its digest record (taken when "
                f"it was known good) says {self.size}; the file was truncated or changed (record it again if it was "
                f"replaced on purpose, or set ONNX_NUMBA_CHECK_WEIGHTS=0 to load it anyway)")
        if length <= 0:
            return
        view = memoryview(data)
        for k in range(offset // self.chunk, (offset + length - 1) // self.chunk + 1):
            if k in self.checked:
                continue
            lo, hi = k * self.chunk, min(self.size, (k + 1) * self.chunk)
            if zlib.crc32(view[lo:hi]) != self.crcs[k]:
                raise ExternalDataDamagedError(
                    f"tensor {tensor!r}: bytes [{lo}, {hi}) of {self.location!r} differ from its digest record "
                    f"(taken when it was known good); the file is damaged or was overwritten (record it again if "
                    f"it was replaced on purpose, or set ONNX_NUMBA_CHECK_WEIGHTS=0 to load it anyway)")
            self.checked.add(k)


def main(argv=None) -> int:
    """``python -m runtime.digests MODEL.onnx ...``: record the data files of each model."""
    args = sys.argv[1:] if argv is None else argv
    if not args or any(a.startswith("-") for a in args):
        print("usage: python -m runtime.digests MODEL.onnx [MODEL.onnx ...]\n"
              "Record the CRC-32 of every 4 MiB of each model's external-data files beside them; later loads "
              "refuse a file that no longer matches.")
        return 2
    for m in args:
        written = record(m)
        print(f"{m}: {len(written)} data file(s) recorded" + "".join(f"\n  {w}" for w in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
