"""The streaming speech tests' common step loop: one chunk's symbols, step by step, with the text they stream."""


def chunk_steps(generator, stream, limit):
    """``generate_next_token`` until ``is_done``: (each step's tokens, the text streamed); a chunk that is not done
    after ``limit`` steps fails (a loop that never ends)."""
    steps, text = [], ""
    while not generator.is_done():
        assert len(steps) < limit, f"a chunk was not done after {limit} steps"
        generator.generate_next_token()
        tokens = generator.get_next_tokens()
        steps.append([int(t) for t in tokens])
        if len(tokens):
            text += stream.decode(tokens[0])
    return steps, text
