"""Chat templates: a package's Jinja2 ``chat_template`` rendered over a conversation, as Hugging Face does.

``find_template(folder, config)`` reads the template a tokenizer folder declares: ``tokenizer_config.json``'s
``chat_template`` (a string, or a list of named templates whose ``default`` is taken), else a
``chat_template.jinja`` file beside it; None when there is none.  ``render(template, messages, ...)``
renders it with the variables Hugging Face's ``apply_chat_template`` passes: ``messages``, ``tools``,
``add_generation_prompt`` and the special tokens (``bos_token``, ``eos_token``, ...), plus the helpers
templates call (``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII text).

Invariants: templates run in Jinja2's immutable sandbox (a template cannot reach Python objects' internals or
change its arguments); ``messages`` and ``tools`` may be JSON text (as onnxruntime-genai takes them) or
Python lists; a template's own ``raise_exception`` becomes a ``ValueError`` with its message.
"""
from __future__ import annotations

import json
import os
from datetime import datetime

__all__ = ["find_template", "render", "SPECIAL_TOKEN_KEYS"]

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def find_template(folder: str | None, config: dict):
    """The chat template a tokenizer folder declares, or None."""
    t = config.get("chat_template")
    if isinstance(t, list):  # named templates: [{"name": ..., "template": ...}]
        named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
        t = named.get("default")
    if isinstance(t, str) and t:
        return t
    path = os.path.join(folder, "chat_template.jinja") if folder else None
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    return None


def _parsed(value, what):
    if value is None or not isinstance(value, (str, bytes)):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"apply_chat_template: {what} must be JSON text or a list, got {value[:60]!r}: {exc}") \
            from None


def _raise(message):
    raise ValueError(f"chat template: {message}")


def _tojson(value, indent=None, ensure_ascii=False, sort_keys=False, separators=None):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys, separators=separators)


def render(template: str, messages, tools=None, add_generation_prompt: bool = True, special_tokens=None,
           **extra) -> str:
    """The conversation ``messages`` rendered by ``template`` (see the module docstring for the variables)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    msgs = _parsed(messages, "messages")
    if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
        raise ValueError(f"apply_chat_template: messages must be a list of objects with a role and content, got "
                         f"{type(msgs).__name__}")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"chat template: line {exc.lineno}: {exc.message}") from None
    variables = dict(special_tokens or {})
    variables.update(extra)
    return compiled.render(messages=msgs, tools=_parsed(tools, "tools"),
                           add_generation_prompt=bool(add_generation_prompt), **variables)
