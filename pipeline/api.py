"""A Python API modeled on onnxruntime-genai's.

    import pipeline as og
    model = og.Model("path/to/package")                 # backends from the environment, or native=/device=
    tokenizer = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=64, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(tokenizer.encode("Hello"))
    while not generator.is_done():
        generator.generate_next_token()
        print(generator.get_next_tokens()[0])

or in one call: ``og.generate(model, prompt_ids, max_new_tokens=16)``.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .backends import choice_from_environment, choice_from_names
from .runner import Pipeline
from .sampling import Sampler
from .spec import SearchOptions

__all__ = ["Model", "Tokenizer", "GeneratorParams", "Generator", "generate"]


class Model:
    """A loaded package.  ``native``: component names, 'all' or 'none' (default: the environment)."""

    def __init__(self, path, native=None, device=None, max_length=None):
        from .metadata import load_package
        self.path = str(path)
        self.spec = load_package(self.path)
        dec = self.spec.decoder.name
        if native is None and device is None:
            self.choice = choice_from_environment([n for n in self.spec.components if n != dec], dec)
        else:
            self.choice = choice_from_names(self.spec, native, device)
        self.max_length = max_length
        self._pipeline = None

    @property
    def pipeline(self) -> Pipeline:
        if self._pipeline is None:
            self._pipeline = Pipeline(self.spec, self.choice, self.max_length)
        return self._pipeline


class Tokenizer:
    def __init__(self, model: Model):
        from .tokenizer import Tokenizer as _Tok
        if not model.spec.tokenizer_dir:
            raise FileNotFoundError(f"package {model.path!r} has no tokenizer.json")
        self._tok = _Tok(model.spec.tokenizer_dir)

    def encode(self, text: str) -> np.ndarray:
        return self._tok.encode(text)

    def decode(self, ids) -> str:
        return self._tok.decode(ids)

    def create_stream(self):
        return self._tok.create_stream()


class GeneratorParams:
    def __init__(self, model: Model):
        self.model = model
        self.search = dataclasses.replace(model.spec.search)
        self.extra_inputs = {}

    def set_search_options(self, **options):
        fields = {f.name for f in dataclasses.fields(SearchOptions)}
        for k, v in options.items():
            if k not in fields:
                raise ValueError(f"unknown search option {k!r}; expected one of {sorted(fields)}")
            setattr(self.search, k, v)

    def set_inputs(self, **named):
        """Extra inputs of prompt-only components, e.g. pixel_values=..."""
        self.extra_inputs.update(named)


class Generator:
    def __init__(self, model: Model, params: GeneratorParams):
        ml = int(params.search.max_length)
        if ml <= 0:  # onnxruntime-genai's wording
            raise RuntimeError(f"search max_length is {ml}")
        ctx = model.spec.context_length
        if ctx and ml > int(ctx):
            raise RuntimeError(f"max_length ({ml}) cannot be greater than model context_length ({ctx})")
        self.model = model
        self.params = params
        self.pipe = model.pipeline
        self._prompt = []
        self._tokens = []
        self._iter = None
        self._done = False
        self._last = None

    def append_tokens(self, ids):
        ids = [int(t) for t in np.asarray(ids).reshape(-1)]
        if self._iter is not None:
            raise RuntimeError("append_tokens after generation started is not supported; use rewind_to first")
        ml = int(self.params.search.max_length)
        if len(self._prompt) + len(ids) > ml:
            raise RuntimeError(f"input_ids size ({len(ids)}) + current sequence length ({len(self._prompt)}) exceeds "
                               f"max length ({ml})")
        self._prompt.extend(ids)

    def _start(self):
        s = self.params.search
        max_new = max(0, int(s.max_length) - len(self._prompt))
        self._iter = self.pipe.tokens(self._prompt, max_new, Sampler(s), self.params.extra_inputs, s)

    def is_done(self) -> bool:
        return self._done

    def generate_next_token(self):
        if self._done:
            return
        ml = int(self.params.search.max_length)
        if len(self._prompt) + len(self._tokens) >= ml:
            raise RuntimeError(f"GenerateNextToken called with sequence length already at max_length ({ml})")
        if self._iter is None:
            self._start()
        try:
            self._last = next(self._iter)
            self._tokens.append(self._last)
        except StopIteration:
            pass
        self._done = self._iter.done  # the pipeline's stop rules: EOS, max_length

    def get_next_tokens(self):
        return [self._last]

    def get_sequence(self, index=0):
        return list(self._prompt) + list(self._tokens)

    def rewind_to(self, length: int):
        """Keep the first ``length`` tokens of the sequence and regenerate from there."""
        seq = self.get_sequence()
        if length > len(seq):
            raise ValueError(f"cannot rewind to {length}: the sequence holds {len(seq)} tokens")
        self._prompt = seq[:length]
        self._tokens = []
        self._iter = None
        self._done = False


def generate(model: Model, prompt_ids, max_new_tokens=None, inputs=None, **search) -> list:
    """Generate in one call; ``inputs``: extra inputs of prompt-only components (e.g. pixel_values)."""
    params = GeneratorParams(model)
    if search:
        params.set_search_options(**search)
    s = params.search
    return model.pipeline.generate(prompt_ids, max_new_tokens, sampler=Sampler(s), search=s, external=inputs)
