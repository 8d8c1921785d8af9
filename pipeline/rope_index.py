"""Qwen-VL's 3-D (temporal, height, width) position ids of a prompt with images, as onnxruntime-genai builds them.

``qwen_rope_index(ids, image_grid_thw, ...)`` follows onnxruntime-genai's ``Qwen2VLPositionInputs`` (its port of
Hugging Face's ``get_rope_index``), row by row of ``ids`` ``[batch, seq]``:

- an image starts where ``vision_start_token_id`` is followed by ``image_token_id``; its ``t * h * w /
  spatial_merge_size**2`` tokens (from the next ``image_grid_thw`` row) take positions ``start + (frame,
  row, column)`` of the merged grid, ``start`` being one past the largest position so far;
- text takes the same position on all three streams, counting on from one past the largest position so far
  (from 0 at the start of the first row; onnxruntime-genai starts later rows' first text at 1); a
  ``pad_token_id`` takes position 0 and does not count.

Returns the positions ``[3, batch, seq]`` int64 and each row's largest position: decoding continues from it + 1
on every stream (``carry_max``).  An image whose tokens run past the prompt, or more images than grid rows, is an
error naming it.
"""
from __future__ import annotations

import numpy as np

__all__ = ["qwen_rope_index"]


def qwen_rope_index(ids, image_grid_thw, image_token_id: int, vision_start_token_id: int, spatial_merge_size: int = 2,
                    pad_token_id: int | None = None):
    ids = np.asarray(ids, np.int64)
    if ids.ndim != 2:
        raise ValueError(f"qwen_rope_index: expected ids [batch, seq], got shape {list(ids.shape)}")
    grids = np.asarray(image_grid_thw, np.int64).reshape(-1, 3) if image_grid_thw is not None else np.zeros((0, 3))
    b_n, n = ids.shape
    pos = np.zeros((3, b_n, n), np.int64)
    maxima = []
    image = 0
    for b in range(b_n):
        row = ids[b]
        starts = [s + 1 for s in range(n - 1) if row[s] == vision_start_token_id and row[s + 1] == image_token_id]
        st, top = 0, 0

        def text(lo, hi, first):
            nonlocal top
            cur = first
            for s in range(lo, hi):
                if pad_token_id is not None and row[s] == pad_token_id:
                    pos[:, b, s] = 0
                else:
                    pos[:, b, s] = cur
                    top = cur
                    cur += 1

        for k, ed in enumerate(starts):
            if image >= grids.shape[0]:
                raise ValueError(f"the prompt has more images than image_grid_thw rows ({grids.shape[0]})")
            t, h, w = (int(v) for v in grids[image])
            image += 1
            gh, gw = h // spatial_merge_size, w // spatial_merge_size
            text(st, ed, top + 1 if (k > 0 or b > 0) else 0)
            first = top + 1
            length = t * gh * gw
            if ed + length > n:
                raise ValueError(f"image {image - 1}: its {length} tokens run past the prompt ({n} tokens)")
            r = np.arange(length)
            pos[0, b, ed:ed + length] = first  # an image's frames share one time position
            pos[1, b, ed:ed + length] = (r // gw) % gh + first
            pos[2, b, ed:ed + length] = r % gw + first
            top = max(top, int(pos[:, b, ed:ed + length].max()))
            st = ed + length
        if st < n:
            text(st, n, 0 if (top == 0 and st == 0) else top + 1)
        maxima.append(top)
    return pos, np.asarray(maxima, np.int64)
