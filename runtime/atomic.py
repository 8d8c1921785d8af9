"""Files replaced whole: a reader sees the old content or the new one, never a half-written file.

``write_atomic`` writes into a temporary file beside the target, named for the process and the thread (so two
writers never share one), and renames it into place.  On any failure the temporary file is removed and the
error raised; the target keeps what it held.
"""
from __future__ import annotations

import os
import threading

__all__ = ["write_atomic"]


def write_atomic(path: str, data) -> None:
    """Replace the file at ``path`` with ``data`` (``str`` is written as text, ``bytes`` as they are)."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            try:
                os.unlink(tmp)
            except OSError:
                pass
