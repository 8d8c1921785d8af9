"""onnxruntime-genai's process-wide calls (``pipeline/environment.py``) and the small API types around them:
log options and where their lines go, providers on hand, ``NamedTensors``, ``Config``'s providers."""
import numpy as np
import pytest

import pipeline as og
from fixtures import gpt2_legacy


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return gpt2_legacy.build(str(tmp_path_factory.mktemp("gpt2_env")))


@pytest.fixture
def quiet_logs():
    yield
    og.set_log_callback(None)
    og.set_log_options(enabled=False, filename="", append_next_tokens=False, hit_max_length=False,
                       generate_next_token=False, hit_eos=False)


def _run(package, max_length=7):
    m = og.Model(package, native="none")
    params = og.GeneratorParams(m)
    params.set_search_options(max_length=max_length)
    g = og.Generator(m, params)
    g.append_tokens(np.array([[1, 7, 8, 9]], np.int32))
    while not g.is_done():
        g.generate_next_token()
    return g


def test_log_options_are_checked_by_name_and_type(quiet_logs):
    with pytest.raises(RuntimeError, match="Unknown log option 'colour'"):
        og.set_log_options(colour=True)
    with pytest.raises(RuntimeError, match="can be bool/string:enabled"):
        og.set_log_options(enabled=1)
    with pytest.raises(RuntimeError, match="can be bool/string:filename"):
        og.set_log_options(filename=3)


def test_the_callback_gets_a_line_per_event_asked_for(package, quiet_logs):
    lines = []
    og.set_log_callback(lines.append)
    _run(package)
    assert lines == []  # logging is off until enabled
    og.set_log_options(enabled=True, append_next_tokens=True, hit_max_length=True, generate_next_token=True)
    g = _run(package)
    seq = g.get_sequence(0).tolist()
    appended = [ln for ln in lines if ln.startswith("  append_next_tokens   ")]
    assert appended[0] == "  append_next_tokens   1 7 8 9 \n"
    assert [int(ln.split()[1]) for ln in appended[1:]] == seq[4:]
    assert sum(ln.startswith("  generate_next_token   do_sample: 0") for ln in lines) == len(seq) - 4
    assert lines[-1] == "  hit_max_length   greedy cpu hit\n"


def test_a_log_file_takes_the_lines_instead_of_the_callback(package, quiet_logs, tmp_path):
    lines = []
    og.set_log_callback(lines.append)
    log = tmp_path / "genai.log"
    og.set_log_options(enabled=True, append_next_tokens=True, filename=str(log))
    _run(package)
    assert lines == [] and log.read_text().startswith("  append_next_tokens   1 7 8 9 \n")


def test_providers_on_hand():
    from runtime import cuda as rc
    assert og.is_cuda_available() is rc.available()
    assert not (og.is_dml_available() or og.is_openvino_available() or og.is_qnn_available()
                or og.is_webgpu_available())
    og.disable_telemetry_events()
    og.enable_telemetry_events()
    assert og.get_current_gpu_device_id() == 0
    with pytest.raises(RuntimeError, match="device index"):
        og.set_current_gpu_device_id(-1)


def test_named_tensors_hold_tensors_and_list_their_names():
    named = og.NamedTensors()
    named["a"] = np.arange(3, dtype=np.int32)
    named["b"] = og.Tensor(np.ones((2, 2), np.float32))
    assert isinstance(named["a"], og.Tensor) and named["a"].as_numpy().tolist() == [0, 1, 2]
    for name in named.keys():  # deleting while iterating, as onnxruntime-genai's test does
        del named[name]
    assert len(named) == 0


def test_a_provider_is_checked_when_the_model_loads(package):
    config = og.Config(package)
    config.clear_providers()
    config.append_provider("slide rule")  # accepted here, as in onnxruntime-genai
    config.set_provider_option("cuda", "infinite_clock", "1")
    with pytest.raises(RuntimeError, match="Unknown provider name 'slide rule'"):
        og.Model(config)
    config = og.Config(package)
    config.clear_providers()
    config.append_provider("CPUExecutionProvider")
    assert og.Model(config).device_type == "CPU"
