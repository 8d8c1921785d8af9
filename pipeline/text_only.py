"""Text-only admission: a split VLM whose image preprocessing cannot be represented here decodes text only.

A package whose processor config declares dynamic image resizing (Qwen's
``smart_resize``, min/max pixel budgets) changes the number of image tokens
per image; nothing in a ``PipelineSpec`` can describe that.  Such a split VLM
(vision, embedding, decoder) is admitted for text decoding instead: the vision
components, their edges and stages are dropped, the one embedding component
feeding the decoder's ``inputs_embeds`` takes the prompt ids, each of its
inputs fed by the vision side gets a zero-token ``AbsentValue``, and
``spec.text_only`` / ``spec.text_only_reason`` are set.

``images_optional`` is the first half of that admission without the removal: a split VLM whose processor is
implemented keeps its vision side, and a prompt without images feeds the embedding the zero-token value.

Admission only ever removes: a package it cannot reduce that way (no single
embedder, a vision edge into another component) raises ``MetadataError``
naming the reason.  A package without a processor config is left as declared.
"""
from __future__ import annotations

import os
import re

from .package_checks import Graphs, position_rank
from .spec import AbsentValue, ComponentSpec, MetadataError, PipelineSpec, Positions, Stage

__all__ = ["preprocessing_unrepresentable", "admit_text_only", "images_optional", "is_vision", "is_media"]

_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
_DYNAMIC_RESIZE = re.compile(r"smart_?resize|min_pixels|max_pixels|qwen2(_5)?_?vl|qwen3_?vl", re.IGNORECASE)


def is_vision(comp: ComponentSpec) -> bool:
    return "vision" in comp.type.lower() or "image" in comp.type.lower()


def is_media(comp: ComponentSpec) -> bool:
    """A component that turns the caller's images or clips into features for the embedding (vision, or a
    Phi-4-multimodal speech encoder); a prompt may come without what it reads."""
    return is_vision(comp) or comp.type == "speech_encoder"


def preprocessing_unrepresentable(root: str) -> str | None:
    """Why the package's declared image preprocessing cannot be represented here, or None.

    Qwen-VL processors resize each image with ``smart_resize`` to a pixel budget (min/max_pixels) that changes
    the number of image tokens per image; nothing in a PipelineSpec can describe that.  A package that declares
    no processor config is left as declared (its images are fed already preprocessed).
    """
    for name in _PROCESSOR_FILES:
        p = os.path.join(root, name)
        if not os.path.isfile(p):
            continue
        with open(p, encoding="utf-8", errors="replace") as f:
            text = f.read()
        m = _DYNAMIC_RESIZE.search(text)
        if m:
            return f"{name} declares {m.group(0)!r} image resizing, which a pipeline spec cannot represent"
    return None


def _absent_value(shape, dtype, hidden) -> AbsentValue:
    """Zeros with a zero-length first symbolic dim (no image tokens); other symbolic dims get ``hidden`` or 1."""
    if not shape:
        return AbsentValue([0], dtype)
    out, zeroed = [], False
    for j, d in enumerate(shape):
        if isinstance(d, int) and d > 0:
            out.append(d)
        elif not zeroed:
            out.append(0)
            zeroed = True
        else:
            out.append(hidden if (j == len(shape) - 1 and hidden) else 1)
    if not zeroed:
        out[0] = 0
    return AbsentValue(out, dtype)


def images_optional(spec: PipelineSpec, graphs: Graphs, key: str, reason: str = "images optional"):
    """Keep the vision side of a split VLM but let a prompt come without images: the embedding's inputs fed by
    vision get a zero-token ``AbsentValue`` (fed when the vision stage did not run); returns the embedding and
    the vision component names."""
    decoder = spec.decoder
    vision = [n for n, c in spec.components.items() if is_media(c)]
    embedders = {e.src for e in spec.dataflow if e.dst == decoder.name and e.src not in vision}
    if decoder.io.sequence_source != "inputs_embeds" or len(embedders) != 1:
        raise MetadataError(f"{key}: text-only admission needs one embedding component feeding the decoder's "
                            f"inputs_embeds ({reason})")
    emb = spec.components[next(iter(embedders))]
    ek = f"{key}.models.{emb.name}.io.token_input" if key == "pipeline" else f"{key}.{emb.name}.inputs.input_ids"
    eins = graphs(emb)[0]
    if emb.io.token_input is None:
        ints = [p for p, (_, dt) in eins.items() if dt in ("int64", "int32")]
        if len(ints) != 1:
            raise MetadataError(f"{ek}: required for text-only admission (integer inputs: {ints})")
        emb.io.token_input = ints[0]
    hidden = getattr(spec, "hidden_size", None)
    dshape = graphs(decoder)[0][decoder.io.inputs_embeds_input][0]
    if not hidden and dshape and isinstance(dshape[-1], int) and dshape[-1] > 0:
        hidden = dshape[-1]
    for e in spec.dataflow:
        if e.src in vision and e.dst == emb.name and e.dst_port not in emb.io.optional_inputs:
            shape, dtype = eins[e.dst_port]
            emb.io.optional_inputs[e.dst_port] = _absent_value(shape, dtype, hidden)
    return emb, vision


def admit_text_only(spec: PipelineSpec, graphs: Graphs, key: str, reason: str | None = None):
    """Drop the vision side of a split VLM whose image preprocessing cannot be represented (``reason``: why; by
    default the processor config's)."""
    reason = reason or preprocessing_unrepresentable(spec.root)
    if reason is None:
        return
    emb, vision = images_optional(spec, graphs, key, reason)
    decoder = spec.decoder
    for e in spec.dataflow:
        if e.src in vision and e.dst not in vision and e.dst != emb.name:
            raise MetadataError(f"{key}: text-only admission cannot drop the edge {e.src}.{e.src_port} -> "
                                f"{e.dst}.{e.dst_port} ({reason})")
    spec.dataflow = [e for e in spec.dataflow if e.src not in vision and e.dst not in vision]
    spec.stages = [s for s in spec.stages if s.model not in vision]
    if not any(s.model == emb.name for s in spec.stages):
        spec.stages.insert(0, Stage("embed", "single_pass", emb.name, "every_step"))
    for n in vision:
        del spec.components[n]
    pin = decoder.io.position_ids_input
    if pin is not None:
        rank = position_rank(graphs(decoder)[0][pin][0]) or (spec.positions.rank if spec.positions else 1)
        spec.positions = Positions(pin, rank, "linear_increment")
    spec.text_only = True
    spec.text_only_reason = reason
