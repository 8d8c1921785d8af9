"""The OpenAI-compatible server (``pipeline/server.py``) over real HTTP: one uvicorn server for the module, on a
free port in a background thread, serving the tiny llama fixture (a copy that declares a chat template).

Expectations, fixed before running: greedy answers (temperature 0) are the token ids a directly driven ``Engine``
with the same settings produces, and the ids ``pipeline.generate`` produces, exactly; seeded choice ``i`` of
``n`` is the engine's answer for ``seed + i`` exactly; streamed deltas concatenate to the unstreamed text
exactly; a stop string cuts the text just before its first occurrence and ends the choice after the fewest
tokens whose text holds it; a client gone mid-stream leaves its request cancelled and no KV block in use.
"""
import json
import os
import shutil
import socket
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
import uvicorn

from pipeline import api
from pipeline.__main__ import main
from pipeline.engine import Engine, SamplingParams
from pipeline.server import _Choice, make_app
from pipeline.tokenizer import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "fixtures", "packages", "llama_fp32")
SETTINGS = dict(block_size=4, max_batch=4, max_model_len=256)
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
PROMPT = "Hello world, this is a test"
MODEL = "llama_fp32"
REPL = "\ufffd"


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    dst = tmp_path_factory.mktemp("server") / MODEL
    shutil.copytree(FIXTURE, dst)
    cfg_path = dst / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    return str(dst)


@pytest.fixture(scope="module")
def server(package):
    engine = Engine(package, **SETTINGS)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(make_app(engine), log_level="warning", lifespan="on"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    try:
        yield SimpleNamespace(engine=engine, client=client, url=f"http://127.0.0.1:{port}", tok=Tokenizer(package))
    finally:
        client.close()
        srv.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture(scope="module")
def reference(package):
    """Output ids of a directly driven engine with the server's settings."""
    engine = Engine(package, **SETTINGS)

    def run(prompt_ids, **params):
        return engine.generate([list(prompt_ids)], SamplingParams(**params))[0]
    return run


def _ids(tok, text):
    return [int(t) for t in tok.encode(text)]


def _events(response):
    """The JSON chunks of a server-sent event stream, checking that it ends with [DONE]."""
    data = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert data and data[-1] == "[DONE]"
    assert "[DONE]" not in data[:-1]
    return [json.loads(d) for d in data[:-1]]


def _stream(server, path, body):
    with server.client.stream("POST", path, json=dict(body, stream=True)) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return _events(r)


def _idle(engine, timeout=10.0):
    """Poll until no KV block is in use; the stats then."""
    deadline = time.monotonic() + timeout
    while True:
        s = engine.stats()
        if s["kv_blocks_in_use"] == 0 and s["running"] == 0 and s["waiting"] == 0:
            return s
        assert time.monotonic() < deadline, f"blocks still in use: {s}"
        time.sleep(0.02)


@pytest.fixture
def slow_engine(server):
    """The server's engine slowed to at least 20 ms a step, so that a request outlives its client's departure
    by a wide margin (the tiny model decodes 200 tokens in a fraction of a second)."""
    decoder = server.engine.decoder
    run = decoder.run

    def slow(*args, **kwargs):
        time.sleep(0.02)
        return run(*args, **kwargs)
    decoder.run = slow
    try:
        yield server.engine
    finally:
        del decoder.run


def _finish(ids, eos=(2,)):
    """The finish reason of a greedy answer cut by max_tokens or the fixture's EOS id."""
    return "stop" if ids and ids[-1] in eos else "length"


def _error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param and err["code"] == code
    return err


# -- completions ----------------------------------------------------------------------------------------
def test_completion_greedy_matches_engine_and_generate(server, reference, package):
    prompt = _ids(server.tok, PROMPT)
    want = reference(prompt, max_tokens=12)
    assert want == [int(t) for t in api.generate(api.Model(package), prompt, max_new_tokens=12, do_sample=False)]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    r = server.client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-") and out["model"] == MODEL
    assert isinstance(out["created"], int)
    [choice] = out["choices"]
    assert choice["index"] == 0
    assert choice["token_ids"] == want and out["prompt_token_ids"] == prompt
    assert choice["text"] == server.tok.decode(want)
    assert choice["finish_reason"] == _finish(want)
    assert out["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(want),
                            "total_tokens": len(prompt) + len(want)}
    for other in (prompt, [PROMPT]):  # token ids, and a list holding one string: the same answer
        again = server.client.post("/v1/completions", json=dict(body, prompt=other)).json()
        assert again["choices"][0]["token_ids"] == want and again["choices"][0]["text"] == choice["text"]


def test_completion_stream_concatenates_to_the_whole_text(server):
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    whole = server.client.post("/v1/completions", json=body).json()
    chunks = _stream(server, "/v1/completions", dict(body, stream_options={"include_usage": True}))
    *parts, usage = chunks
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in parts) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in parts][-1] == whole["choices"][0]["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in parts[:-1])
    assert len(parts) > 2  # it did stream


def test_n_choices_with_a_seed_are_the_engine_seeded_answers(server, reference):
    prompt = _ids(server.tok, PROMPT)
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 11, "n": 2, "return_token_ids": True}
    out = server.client.post("/v1/completions", json=body).json()
    assert [c["index"] for c in out["choices"]] == [0, 1]
    for i, c in enumerate(out["choices"]):
        want = reference(prompt, max_tokens=8, temperature=1.0, seed=11 + i)
        assert c["token_ids"] == want and c["text"] == server.tok.decode(want)
    assert out["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in out["choices"])
    assert out["usage"]["prompt_tokens"] == len(prompt)
    chunks = _stream(server, "/v1/completions", body)
    for i, c in enumerate(out["choices"]):
        assert "".join(ch["choices"][0]["text"] for ch in chunks if ch["choices"][0]["index"] == i) == c["text"]


def test_stop_string_cuts_the_text_and_frees_the_request(server, reference):
    prompt = _ids(server.tok, PROMPT)
    full_ids = reference(prompt, max_tokens=12, ignore_eos=True)
    full = server.tok.decode(full_ids)
    stop = next(full[i:i + 2] for i in range(3, len(full) - 1) if REPL not in full[i:i + 2])
    want_text = full[:full.find(stop)]
    want_tokens = next(k for k in range(1, len(full_ids) + 1) if stop in server.tok.decode(full_ids[:k]))
    assert want_tokens < 12
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    for stops in (stop, [stop, "never-seen"]):
        out = server.client.post("/v1/completions", json=dict(body, stop=stops)).json()
        [c] = out["choices"]
        assert c["text"] == want_text and c["finish_reason"] == "stop"
        assert c["token_ids"] == full_ids[:want_tokens] and out["usage"]["completion_tokens"] == want_tokens
        chunks = _stream(server, "/v1/completions", dict(body, stop=stops))
        assert "".join(ch["choices"][0]["text"] for ch in chunks) == want_text
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    _idle(server.engine)


class _FakeRequest:
    def __init__(self):
        self.output, self.done, self.finish_reason = [], False, None


def test_incremental_decoding_holds_split_characters_and_stop_prefixes(server):
    tok = server.tok
    text = "héllo ☃ 😀 ok ☃☃"
    ids = _ids(tok, text)
    assert tok.decode(ids) == text and len(ids) > len(text.split())  # characters split over tokens
    for stops, want in (((), text), (("😀",), "héllo ☃ "), (("o ☃☃", "k ☃"), "héllo ☃ 😀 o")):
        req = _FakeRequest()
        choice = _Choice(0, req, tok, stops)
        pieces = []
        for t in ids:
            req.output.append(t)
            d = choice.advance()
            if d is not None:
                assert REPL not in d.text
                pieces.append(d.text)
            if choice.finish_reason:
                break
        if not choice.finish_reason:
            req.done, req.finish_reason = True, "length"
            pieces.append(choice.advance().text)
        assert "".join(pieces) == want == choice.text
        if stops:
            k = choice.completion_tokens  # the fewest tokens whose text holds a stop string
            assert choice.finish_reason == "stop"
            assert any(s in tok.decode(ids[:k]) for s in stops) and not any(s in tok.decode(ids[:k - 1]) for s in stops)



class _CountingTokenizer:
    def __init__(self, tok):
        self.tok, self.decoded = tok, 0

    def decode(self, ids):
        self.decoded += len(ids)
        return self.tok.decode(ids)


def test_incremental_decoding_work_does_not_grow_with_the_output(server):
    """A long output is decoded a window at a time (linear work in its length, not quadratic), the text is the
    whole decode, and a stop string late in it is still found where it completes."""
    base = "héllo ☃ 😀 ok, "
    text = base * 40 + "STOP here"
    ids = _ids(server.tok, text)
    for stops, want in (((), text), (("STOP",), base * 40)):
        tok = _CountingTokenizer(server.tok)
        req = _FakeRequest()
        choice = _Choice(0, req, tok, stops)
        pieces = []
        for t in ids:
            req.output.append(t)
            d = choice.advance()
            if d is not None:
                pieces.append(d.text)
            if choice.finish_reason:
                break
        if not choice.finish_reason:
            req.done, req.finish_reason = True, "length"
            pieces.append(choice.advance().text)
        assert "".join(pieces) == want == choice.text
        assert tok.decoded < 20 * len(ids), (tok.decoded, len(ids))  # a whole decode per token: ~len(ids)**2 / 2

# -- chat -----------------------------------------------------------------------------------------------
def test_chat_completion_uses_the_template(server, reference):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    prompt = _ids(server.tok, "<|system|>Be brief.\n<|user|>Hi there\n<|assistant|>")
    want = reference(prompt, max_tokens=8)
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
    out = server.client.post("/v1/chat/completions", json=body).json()
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    [c] = out["choices"]
    assert c["message"] == {"role": "assistant", "content": server.tok.decode(want)}
    assert c["finish_reason"] == _finish(want)
    assert out["usage"]["prompt_tokens"] == len(prompt) and out["usage"]["completion_tokens"] == len(want)
    chunks = _stream(server, "/v1/chat/completions", body)
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks) == c["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == c["finish_reason"]
    # text parts are joined into one content string
    parts = [dict(m, content=[{"type": "text", "text": m["content"][:3]}, {"type": "text", "text": m["content"][3:]}])
             for m in messages]
    assert server.client.post("/v1/chat/completions", json=dict(body, messages=parts)).json()["choices"] == \
        out["choices"]


def test_chat_max_tokens_defaults_to_the_rest_of_the_context(server):
    n = 1
    while True:  # a conversation that leaves a few positions of the 256-token context
        messages = [{"role": "user", "content": "word " * n}]
        prompt = _ids(server.tok, f"<|user|>{'word ' * n}\n<|assistant|>")
        if len(prompt) >= 248:
            break
        n += 1
    assert len(prompt) < 256
    out = server.client.post("/v1/chat/completions", json={"messages": messages, "temperature": 0,
                                                           "ignore_eos": True}).json()
    assert out["usage"]["prompt_tokens"] == len(prompt)
    assert out["usage"]["completion_tokens"] == 256 - len(prompt)
    assert out["choices"][0]["finish_reason"] == "length"


# -- the other endpoints --------------------------------------------------------------------------------
def test_models_and_health(server):
    r = server.client.get("/v1/models")
    assert r.status_code == 200
    out = r.json()
    assert out["object"] == "list" and [m["id"] for m in out["data"]] == [MODEL]
    assert out["data"][0]["object"] == "model"
    assert server.client.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    _error(server.client.get("/v1/models/other"), 404, "model", "model_not_found")
    r = server.client.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_metrics_report_the_engine_stats(server):
    for _ in range(2):  # the same prompt twice: the second reuses the first one's full blocks
        assert server.client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}).status_code == 200
    stats = _idle(server.engine)
    r = server.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    values, types = {}, {}
    for line in r.text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
        elif line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            name, labels = name_labels.split("{", 1)
            assert labels == f'model_name="{MODEL}"}}'
            values[name] = float(value)
    want = {"requests_total": "requests", "requests_finished_total": "finished",
            "requests_cancelled_total": "cancelled", "request_errors_total": "errors",
            "prompt_tokens_total": "prompt_tokens", "generation_tokens_total": "generated_tokens",
            "requests_waiting": "waiting", "requests_running": "running", "kv_blocks_in_use": "kv_blocks_in_use",
            "kv_blocks_total": "kv_blocks_total", "prefix_cache_hit_blocks_total": "prefix_hit_blocks"}
    for name, key in want.items():
        assert values["onnx_numba_" + name] == stats[key], name
        assert types["onnx_numba_" + name] == ("counter" if name.endswith("_total") and name != "kv_blocks_total"
                                               else "gauge")
    assert values["onnx_numba_requests_total"] >= 2 and values["onnx_numba_kv_blocks_in_use"] == 0
    assert values["onnx_numba_kv_blocks_total"] == server.engine.pool.num_blocks
    assert values["onnx_numba_prefix_cache_hit_blocks_total"] > 0


# -- errors ---------------------------------------------------------------------------------------------
def test_bad_requests_get_openai_errors(server):
    before = server.engine.stats()["requests"]
    post = server.client.post
    headers = {"content-type": "application/json"}
    err = _error(post("/v1/completions", content=b'{"prompt": "x",', headers=headers), 400)
    assert "JSON" in err["message"]
    _error(post("/v1/completions", content=b"[1, 2]", headers=headers), 400)
    _error(post("/v1/completions", json={"model": "gpt-4", "prompt": "x"}), 404, "model", "model_not_found")
    _error(post("/v1/completions", json={"max_tokens": 4}), 400, "prompt", "missing_required_parameter")
    _error(post("/v1/completions", json={"prompt": "x", "max_tokens": "ten"}), 400, "max_tokens", "invalid_type")
    _error(post("/v1/completions", json={"prompt": "x", "temperature": True}), 400, "temperature", "invalid_type")
    _error(post("/v1/completions", json={"prompt": {"a": 1}}), 400, "prompt", "invalid_type")
    _error(post("/v1/completions", json={"prompt": "x", "stop": [1]}), 400, "stop", "invalid_type")
    _error(post("/v1/completions", json={"prompt": "x", "logprobs": 3}), 400, "logprobs", "unsupported_parameter")
    err = _error(post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1000}), 400)
    assert "exceeds the model's context of 256 tokens" in err["message"]
    err = _error(post("/v1/completions", json={"prompt": [7] * 300, "max_tokens": 1}), 400)
    assert "300 tokens" in err["message"]
    err = _error(post("/v1/completions", json={"prompt": [600], "max_tokens": 1}), 400)
    assert "outside the vocabulary" in err["message"]
    _error(post("/v1/completions", json={"prompt": "x", "top_p": 0}), 400)
    _error(post("/v1/chat/completions", json={"max_tokens": 1}), 400, "messages", "missing_required_parameter")
    _error(post("/v1/chat/completions", json={"messages": [{"content": "hi"}]}), 400, "messages[0]", "invalid_type")
    _error(server.client.get("/v1/nowhere"), 404, code="not_found")
    _error(server.client.get("/v1/completions"), 405, code="method_not_allowed")
    assert server.engine.stats()["requests"] == before  # nothing refused reached the engine's queue


def test_client_gone_mid_stream_cancels_its_request(server, slow_engine):
    before = server.engine.stats()["cancelled"]
    body = {"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            first = next(line for line in r.iter_lines() if line.startswith("data: "))
            call_id = json.loads(first[len("data: "):])["id"]
    stats = _idle(server.engine)
    req = server.engine.requests[f"{call_id}-0"]
    assert req.finish_reason == "cancelled" and len(req.output) < 200
    assert stats["cancelled"] == before + 1


def test_client_gone_while_waiting_for_a_whole_answer_cancels_its_request(server, slow_engine):
    before = server.engine.stats()["cancelled"]
    body = {"prompt": PROMPT, "max_tokens": 240, "temperature": 0, "ignore_eos": True}
    with httpx.Client(base_url=server.url, timeout=0.3) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post("/v1/completions", json=body)
    stats = _idle(server.engine)
    req = server.engine.requests[next(reversed(server.engine.requests))]
    assert req.finish_reason == "cancelled" and len(req.output) < 240
    assert stats["cancelled"] == before + 1


def test_serve_command_reports_a_missing_package(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "missing"), "--port", "0"]) == 2
    assert "python -m pipeline serve: error:" in capsys.readouterr().err
