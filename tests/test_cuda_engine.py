"""The serving engine on the CUDA provider (the simulator without a GPU): the pools live on the device and are
written in place by the paged attention kernel; greedy tokens of a batch are the CPU engine's."""
import os

import numpy as np

from runtime import cuda as rc  # importing runtime.cuda never imports numba.cuda

from cuda_target import use_cuda_or_skip  # noqa: E402

use_cuda_or_skip("CUDA engine")

from pipeline.engine import Engine, SamplingParams  # noqa: E402

LLAMA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "packages",
                     "llama_fp32")


def test_cuda_engine_batch_matches_the_cpu_engine():
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    prompts = [[7, 300], [5]]
    want = Engine(LLAMA, block_size=2, max_batch=2, max_model_len=8).generate(prompts, params)
    eng = Engine(LLAMA, block_size=2, max_batch=2, max_model_len=8, providers=["CUDAExecutionProvider"])
    assert all(rc.is_device_array(p) for p in eng.decoder.pools.values())
    assert eng.generate(prompts, params) == want
    assert eng.pool.in_use() == 0
    # the blocks the first prompt filled hold its keys: nonzero on the device, untouched blocks still zero
    pool = rc.to_host(next(iter(eng.decoder.pools.values())))
    assert np.abs(pool).sum() > 0
