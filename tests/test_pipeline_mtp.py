"""``MtpGenerator`` (pipeline/mtp.py): an MTP head proposes from the main decoder's hidden states.

Tiny packages built here (``_build``): the main decoder maps token t to ``NEXT[t]`` with a hidden state per
position, and the head proposes from that hidden state, chained on its own feedback output.  Logits and hidden states are float16, as onnxruntime-genai 0.18's
MtpGenerator needs on CPU (it fails on float32 logits).  The tokens must be the main decoder's greedy ones and
onnxruntime-genai's.
"""
import json

import numpy as np
import pytest

import pipeline as pg

V = H = 12
NEXT = {t: (3 * t + 1) % (V - 1) for t in range(V)}


def _save(path, nodes, ins, outs, inits):
    import onnx
    from onnx import helper
    m = helper.make_model(helper.make_graph(nodes, "t", ins, outs, inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.save(m, str(path))


def _build(root, feedback=True, agree=True):
    """The main decoder: token t -> NEXT[t], hidden state one-hot(t).  The head reads only the hidden state of
    its pair, one-hot(t_j), and proposes NEXT[NEXT[t_j]] = t_{j+2} (wrong on every third t unless ``agree``); its
    feedback output is one-hot of its pair's token, so a chained proposal is right only if that output is fed."""
    from onnx import TensorProto as T, helper, numpy_helper as nh
    (root / "main").mkdir(parents=True)
    (root / "head").mkdir()
    tab = np.full((V, V), -10.0, np.float32)
    two = np.zeros((H, V), np.float32)
    for t in range(V):
        tab[t, NEXT[t]] = 10.0
        two[t, NEXT[NEXT[t]] if agree or t % 3 else 5] = 10.0
    eye = np.eye(V, H, dtype=np.float32)
    ids = [helper.make_tensor_value_info("input_ids", T.INT32, ["batch", "sequence"]),
           helper.make_tensor_value_info("attention_mask", T.INT32, ["batch", "total"])]
    f16 = lambda name, last: helper.make_tensor_value_info(name, T.FLOAT16, ["batch", "sequence", last])  # noqa: E731
    _save(root / "main" / "model.onnx",
          [helper.make_node("Gather", ["table", "input_ids"], ["l32"], axis=0),
           helper.make_node("Cast", ["l32"], ["logits"], to=T.FLOAT16),
           helper.make_node("Gather", ["eye", "input_ids"], ["h32"], axis=0),
           helper.make_node("Cast", ["h32"], ["hidden_states"], to=T.FLOAT16)],
          ids, [f16("logits", V), f16("hidden_states", H)], [nh.from_array(tab, "table"), nh.from_array(eye, "eye")])
    nodes = [helper.make_node("Cast", ["hidden_states"], ["h32"], to=T.FLOAT),
             helper.make_node("MatMul", ["h32", "two"], ["l32"]),
             helper.make_node("Cast", ["l32"], ["logits"], to=T.FLOAT16)]
    outs = [f16("logits", V)]
    if feedback:
        nodes += [helper.make_node("Gather", ["eye", "input_ids"], ["fb32"], axis=0),
                  helper.make_node("Cast", ["fb32"], ["hidden_states_out"], to=T.FLOAT16)]
        outs.append(f16("hidden_states_out", H))
    _save(root / "head" / "model.onnx", nodes, ids + [f16("hidden_states", H)], outs,
          [nh.from_array(two, "two"), nh.from_array(eye, "eye")])
    dec = {"filename": "model.onnx", "head_size": 1, "hidden_size": H, "num_attention_heads": 1,
           "num_key_value_heads": 1, "num_hidden_layers": 0,
           "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"},
           "outputs": {"logits": "logits", "hidden_states": "hidden_states"}}
    top = {"type": "llama", "vocab_size": V, "context_length": 64, "bos_token_id": 0, "eos_token_id": [V - 1],
           "pad_token_id": 0}
    mtp = {"filename": "../head/model.onnx", "num_hidden_layers": 1, "main_hidden_states": "hidden_states",
           "outputs": {"hidden_states": "hidden_states_out"}}
    (root / "main" / "genai_config.json").write_text(json.dumps({"model": dict(top, decoder=dec, mtp=mtp)}))
    hdec = dict(dec, outputs={"logits": "logits"},
                inputs={"input_ids": "input_ids", "attention_mask": "attention_mask", "hidden_states": "hidden_states"})
    (root / "head" / "genai_config.json").write_text(json.dumps({"model": dict(top, decoder=hdec)}))
    return str(root / "main"), str(root / "head")


def _run(og, main, head, n, native=None, **search):
    kw = {} if native is None else {"native": native}
    mm, hm = og.Model(main, **kw), og.Model(head, **kw)
    p = og.GeneratorParams(mm)
    p.set_search_options(max_length=20, **search)
    p.set_speculative_options(max_draft_tokens=n)
    g = og.MtpGenerator(mm, hm, p)
    g.append_tokens(np.asarray([1, NEXT[1]], np.int32))  # a prompt that follows NEXT, as the head assumes
    while not g.is_done():
        g.generate_next_token()
    return g.get_sequence().tolist(), g.get_stats()


def test_mtp_generator_gives_the_main_decoders_tokens(ort_genai, tmp_path):
    plain = [1, NEXT[1]]
    while len(plain) < 20:
        plain.append(NEXT[plain[-1]])
    for agree in (True, False):
        main, head = _build(tmp_path / f"agree{agree}", feedback=True, agree=agree)
        for n in (1, 3):
            want = _run(ort_genai, main, head, n)[0]
            assert want == plain
            for native in ("all", "none"):
                got, st = _run(pg, main, head, n, native)
                assert got == want, (agree, n, native)
                assert st["forwards"] == st["target_forward_passes"] and st["trials"] == st["draft_tokens_evaluated"]
                if agree:  # a head that is right: every proposal kept, n + 1 tokens a round
                    assert st["accepts"] == st["trials"] > 0
                else:
                    assert 0 < st["accepts"] < st["trials"] and st["correction_tokens"] > 0


def test_mtp_generator_samples_reproducibly_and_refuses_as_onnxruntime_genai(ort_genai, tmp_path):
    main, head = _build(tmp_path / "fb", feedback=True, agree=False)
    a = _run(pg, main, head, 2, "all", do_sample=True, top_k=3, random_seed=7)[0]
    assert a == _run(pg, main, head, 2, "all", do_sample=True, top_k=3, random_seed=7)[0]
    main1, head1 = _build(tmp_path / "nofb", feedback=False)
    # a config without search.max_length takes the context length, as onnxruntime-genai's does
    assert pg.GeneratorParams(pg.Model(main1)).get_search_options()["max_length"] == \
        ort_genai.GeneratorParams(ort_genai.Model(main1)).get_search_options()["max_length"] == 64
    for og in (ort_genai, pg):
        with pytest.raises(RuntimeError, match=r"max_draft_tokens=3 requires the configured MTP feedback output "
                                               r"'hidden_states_out' \(model.mtp.outputs.hidden_states\)"):
            _run(og, main1, head1, 3)
        mm, hm = og.Model(main1), og.Model(head1)
        p = og.GeneratorParams(mm)
        p.set_search_options(batch_size=2)
        with pytest.raises(RuntimeError, match="MtpGenerator supports only batch_size=1"):
            og.MtpGenerator(mm, hm, p)
        p = og.GeneratorParams(mm)
        p.set_speculative_options(max_draft_tokens=1)
        g = og.MtpGenerator(mm, hm, p)
        with pytest.raises(RuntimeError, match="AppendTokens must be called before GenerateNextToken"):
            g.generate_next_token()
        g.append_tokens(np.asarray([1, 2], np.int32))
        with pytest.raises(RuntimeError, match="AppendTokens can only be called once"):
            g.append_tokens(np.asarray([3], np.int32))
