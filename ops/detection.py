"""Detection ops: NonMaxSuppression.

Boxes and scores are converted to float64 once in the wrapper, so the greedy
selection kernel compiles a single specialization.  Candidates are ordered
by descending score, ties broken by the lower box index (onnxruntime's
order); a candidate is dropped when its IoU with an already selected box of
the same class is strictly above ``iou_threshold``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from .registry import op

__all__ = ["NonMaxSuppression"]


@njit(cache=True, nogil=True)
def _corners(b, center):
    if center:
        hw = b[2] / 2.0
        hh = b[3] / 2.0
        return b[0] - hw, b[0] + hw, b[1] - hh, b[1] + hh
    x0, x1 = min(b[1], b[3]), max(b[1], b[3])
    y0, y1 = min(b[0], b[2]), max(b[0], b[2])
    return x0, x1, y0, y1


@njit(cache=True, nogil=True)
def _suppress(b1, b2, center, thr):
    ax0, ax1, ay0, ay1 = _corners(b1, center)
    bx0, bx1, by0, by1 = _corners(b2, center)
    ix0 = max(ax0, bx0)
    ix1 = min(ax1, bx1)
    if ix1 <= ix0:
        return False
    iy0 = max(ay0, by0)
    iy1 = min(ay1, by1)
    if iy1 <= iy0:
        return False
    inter = (ix1 - ix0) * (iy1 - iy0)
    a1 = (ax1 - ax0) * (ay1 - ay0)
    a2 = (bx1 - bx0) * (by1 - by0)
    union = a1 + a2 - inter
    if inter <= 0 or a1 <= 0 or a2 <= 0 or union <= 0:
        return False
    return inter / union > thr


@njit(cache=True, nogil=True)
def _nms_kernel(boxes, scores, max_out, iou_thr, score_thr, has_score_thr, center):
    nb, nc, n = scores.shape
    cap = nb * nc * min(n, max_out)
    out = np.empty((cap, 3), np.int64)
    sel = np.empty(min(n, max_out), np.int64)
    k = 0
    for b in range(nb):
        for c in range(nc):
            s = scores[b, c]
            order = np.argsort(-s, kind="mergesort")
            ns = 0
            for j in range(n):
                if ns >= max_out:
                    break
                i = order[j]
                if has_score_thr and not (s[i] > score_thr):
                    continue
                keep = True
                for q in range(ns):
                    if _suppress(boxes[b, i], boxes[b, sel[q]], center, iou_thr):
                        keep = False
                        break
                if keep:
                    sel[ns] = i
                    ns += 1
                    out[k, 0] = b
                    out[k, 1] = c
                    out[k, 2] = i
                    k += 1
    return out[:k].copy()


def _scalar(x, default, what):
    if x is None or x.size == 0:
        return default
    if x.size != 1:
        raise InvalidArgumentError(f"NonMaxSuppression: {what} must be a scalar, got shape {list(x.shape)}")
    return x.reshape(-1)[0]


@op("NonMaxSuppression", 10)
def NonMaxSuppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None, score_threshold=None,
                      *, center_point_box=0):
    if center_point_box not in (0, 1):
        raise InvalidAttributeError(f"NonMaxSuppression: center_point_box must be 0 or 1, got {center_point_box}")
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3:
        raise ShapeMismatchError(f"NonMaxSuppression: expected boxes [batch, boxes, 4] and scores "
                                 f"[batch, classes, boxes], got {list(boxes.shape)} and {list(scores.shape)}")
    if boxes.shape[0] != scores.shape[0] or boxes.shape[1] != scores.shape[2]:
        raise ShapeMismatchError(f"NonMaxSuppression: boxes {list(boxes.shape)} and scores {list(scores.shape)} "
                                 "disagree on batch or box count")
    max_out = int(_scalar(max_output_boxes_per_class, 0, "max_output_boxes_per_class"))
    if max_out <= 0 or boxes.shape[1] == 0:
        return np.empty((0, 3), np.int64)
    iou = float(_scalar(iou_threshold, 0.0, "iou_threshold"))
    sthr = _scalar(score_threshold, None, "score_threshold")
    return _nms_kernel(np.ascontiguousarray(boxes, np.float64), np.ascontiguousarray(scores, np.float64),
                       max_out, iou, 0.0 if sthr is None else float(sthr), sthr is not None, bool(center_point_box))
