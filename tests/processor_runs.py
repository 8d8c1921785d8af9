"""The multimodal processor tests' common run: each case's inputs from a package's processor and its greedy tokens,
through onnxruntime-genai's API (``pipeline`` or onnxruntime-genai itself), and the comparison of two such runs."""
import numpy as np


def run_cases(api, path, cases, media, native=None, new_tokens=5):
    """Per case ``(prompt, image indices[, clip index])`` into ``media`` (file paths): ``(inputs as arrays, the
    sequence after new_tokens greedy steps)``, or ``("error", message)`` when the processor refuses the case."""
    model = api.Model(path) if native is None else api.Model(path, native=native)
    processor = model.create_multimodal_processor()
    runs = []
    for case in cases:
        prompt, which = case[0], case[1]
        media_args = {"images": api.Images.open(*[media[k] for k in which]) if which else None}
        if len(case) > 2 and case[2] is not None:
            media_args["audios"] = api.Audios.open(media[case[2]])
        try:
            inputs = processor(prompt, **media_args)
        except RuntimeError as e:
            runs.append(("error", str(e)))
            continue
        arrays = {k: np.array(inputs[k].as_numpy()) for k in inputs.keys()}
        params = api.GeneratorParams(model)
        params.set_search_options(max_length=arrays["input_ids"].shape[1] + new_tokens)
        generator = api.Generator(model, params)
        generator.set_inputs(inputs)
        while not generator.is_done():
            generator.generate_next_token()
        runs.append((arrays, generator.get_sequence(0).tolist()))
    return runs


def assert_same_runs(cases, got, want):
    """Every case's inputs (names, dtypes, shapes, values) and tokens, or its error message, as ``want``'s."""
    for case, g, w in zip(cases, got, want):
        prompt = case[0]
        if w[0] == "error" or g[0] == "error":
            assert g == w, prompt
            continue
        (got_inputs, got_seq), (want_inputs, want_seq) = g, w
        assert sorted(got_inputs) == sorted(want_inputs), prompt
        for k, a in want_inputs.items():
            b = got_inputs[k]
            assert b.dtype == a.dtype and b.shape == a.shape, (prompt, k)
            np.testing.assert_array_equal(b, a, err_msg=f"{prompt!r}: {k}")
        assert got_seq == want_seq, prompt
