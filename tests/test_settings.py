"""Settings from the environment (runtime/settings.py): one rule for every flag, an error for a value it does not
recognise, and the switches that used to read it their own way now obey it."""
import os

import pytest

from runtime import settings
from runtime.settings import SettingError

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "packages")


@pytest.mark.parametrize("name", sorted(settings.FLAGS))
def test_every_flag_reads_the_same_spellings(name):
    for v in ("1", "true", "YES", " on "):
        assert settings.flag(name, {name: v}) is True
    for v in ("0", "False", "no", "OFF"):
        assert settings.flag(name, {name: v}) is False
    assert settings.flag(name, {}) is settings.FLAGS[name]
    assert settings.flag(name, {name: " "}) is settings.FLAGS[name]
    with pytest.raises(SettingError, match=f"{name}='enabled' is not a flag value: expected one of 1, on, true, yes"):
        settings.flag(name, {name: "enabled"})


def test_an_unknown_setting_is_a_programming_error():
    with pytest.raises(KeyError, match="ONNX_NUMBA_NOPE"):
        settings.flag("ONNX_NUMBA_NOPE")


def test_compiled_regions_false_turns_the_native_decoders_regions_off(monkeypatch):
    """``ONNX_NUMBA_COMPILED_REGIONS=false`` used to leave regions on (only "0" was read as off)."""
    from pipeline.backends import BackendChoice
    from pipeline.metadata import load_package
    from pipeline.runner import Pipeline
    spec = load_package(os.path.join(HERE, "llama_fp32"))
    monkeypatch.setenv("ONNX_NUMBA_COMPILED_REGIONS", "false")
    monkeypatch.setenv("ONNX_NUMBA_KV_SHARE_BUFFER", "no")
    pipe = Pipeline(spec, BackendChoice(set(), True, "cpu"))
    assert not pipe.decoder.session.plan.regions and pipe.decoder._want_shared is False
    monkeypatch.setenv("ONNX_NUMBA_COMPILED_REGIONS", "disable")
    with pytest.raises(SettingError, match="ONNX_NUMBA_COMPILED_REGIONS='disable'"):
        Pipeline(spec, BackendChoice(set(), True, "cpu"))


def test_onnxruntime_s_thread_count_is_read_when_asked(monkeypatch):
    """``ONNX_NUMBA_ORT_THREADS``: the intra-op thread count of onnxruntime the MLAS-order kernels follow; unset,
    onnxruntime's default (the physical cores); anything but a positive integer is an error naming it."""
    from ops import _mlas_attention as ma
    monkeypatch.delenv("ONNX_NUMBA_ORT_THREADS", raising=False)
    assert ma.ort_threads() == ma.PHYSICAL_CORES >= 1
    monkeypatch.setenv("ONNX_NUMBA_ORT_THREADS", " 3 ")
    assert ma.ort_threads() == 3
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv("ONNX_NUMBA_ORT_THREADS", bad)
        with pytest.raises(SettingError, match=f"ONNX_NUMBA_ORT_THREADS='{bad}' is not a thread count"):
            ma.ort_threads()
