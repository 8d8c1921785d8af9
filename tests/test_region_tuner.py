"""Compiled regions where they pay (runtime/region_tuner.py): a default session's plan turns on the regions of
small steps after timing its own runs, keeps large tensors and inexact forms out of regions, and checks the
first run on them against the steps they replace."""
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import InferenceSession, RunOptions, SessionOptions
from runtime.region_tuner import SETTLE_RUNS

F = TensorProto.FLOAT
I64 = TensorProto.INT64
DECIDED = SETTLE_RUNS


def _chain(n: int, side: int) -> bytes:
    """``n`` small nodes in a row (Transpose, Neg, Reshape, ...) over a [side, side] float tensor: a per-node
    plan pays one dispatch per node for microseconds of arithmetic when ``side`` is small."""
    nodes, prev = [], "x"
    for i in range(n):
        op = ("Transpose", "Neg", "Reshape")[i % 3]
        if op == "Transpose":
            nodes.append(helper.make_node("Transpose", [prev], [f"v{i}"], perm=[1, 0]))
        elif op == "Neg":
            nodes.append(helper.make_node("Neg", [prev], [f"v{i}"]))
        else:
            nodes.append(helper.make_node("Reshape", [prev, "shape"], [f"v{i}"]))
        prev = f"v{i}"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", F, [side, side])],
                          [helper.make_tensor_value_info(prev, F, None)],
                          [helper.make_tensor("shape", I64, [2], [side, side])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString()


def _session(model, regions=None) -> InferenceSession:
    so = SessionOptions()
    so.compiled_regions = regions
    return InferenceSession(model, so)


def _expected(x, n):
    for i in range(n):
        x = (x.T, -x, x)[i % 3]
    return x


def test_small_steps_get_regions_after_the_timed_runs_and_results_do_not_change(monkeypatch):
    from runtime import region_tuner
    monkeypatch.setattr(region_tuner, "MIN_GAIN", 0.0)  # the gain rule has its own test, free of timing noise
    model, n = _chain(48, 4), 48
    s = _session(model)
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    for k in range(DECIDED):
        assert not s.plan.regions and s.plan.region_choice is None  # undecided until the last timed run
        np.testing.assert_array_equal(s.run(None, {"x": x})[0], _expected(x, n))
    choice = s.plan.region_choice
    assert choice is not None and choice["on"] and choice["small"] == choice["candidates"] > 0, choice
    assert s.plan.regions and len(s.plan.steps) < n
    for _ in range(3):
        np.testing.assert_array_equal(s.run(None, {"x": x})[0], _expected(x, n))
    assert choice["same"] is True  # the first run on the regions was checked against the steps


def test_regions_are_turned_on_only_when_they_save_enough_of_a_run():
    from runtime.region_tuner import DISPATCH_NS, MIN_GAIN, RegionTuner
    model = _chain(48, 4)
    for wall_factor, on in ((0.5, True), (2.0, False)):
        s = _session(model)
        plan = s.plan
        t = RegionTuner()
        t.elements = [16] * len(plan.steps)
        # (every node of the chain is a step of its own: a region of k nodes replaces k steps by one)
        saved = sum(b - a - 1 for a, b, _ in plan._find_regions()) * DISPATCH_NS
        t.wall = int(saved / MIN_GAIN * wall_factor)
        choice = t.decide(plan)
        assert choice["saved_ns"] == saved and choice["on"] is on and bool(plan.regions) is on, choice


def test_large_tensors_keep_their_own_kernels():
    model, n = _chain(12, 256), 12  # 65536 elements per step: above SMALL_ELEMENTS
    s = _session(model)
    x = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    for _ in range(DECIDED + 2):
        np.testing.assert_array_equal(s.run(None, {"x": x})[0], _expected(x, n))
    choice = s.plan.region_choice
    assert choice is not None and choice["candidates"] > 0 and choice["small"] == 0 and not choice["on"], choice
    assert not s.plan.regions and len(s.plan.steps) == n


def test_a_region_whose_form_may_change_the_bits_is_never_chosen():
    """A MatMul's region form runs the panel product on several rows where its wrapper runs BLAS."""
    nodes, prev = [], "x"
    for i in range(10):  # ten units of MatMul, Transpose, Neg: each region piece holds a MatMul
        nodes += [helper.make_node("MatMul", [prev, "w"], [f"m{i}"]),
                  helper.make_node("Transpose", [f"m{i}"], [f"t{i}"], perm=[1, 0]),
                  helper.make_node("Neg", [f"t{i}"], [f"v{i}"])]
        prev = f"v{i}"
    w = np.random.default_rng(2).standard_normal((4, 4)).astype(np.float32)
    g = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", F, [4, 4])],
                          [helper.make_tensor_value_info(prev, F, None)], [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    s = _session(m.SerializeToString())
    x = np.ones((4, 4), np.float32)
    for _ in range(DECIDED + 1):
        s.run(None, {"x": x})
    choice = s.plan.region_choice
    assert choice["candidates"] > 0 and choice["small"] == 0 and not choice["on"], choice
    assert not s.plan.regions


def test_regions_whose_first_run_differs_from_the_steps_are_turned_off(monkeypatch):
    """The run that compiles the chosen regions is checked against the steps they replaced, on its feeds."""
    from runtime.executor import Plan
    model, n = _chain(48, 4), 48
    s = _session(model)
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    real = Plan.run_on

    def off_by_one_bit(plan, steps, feeds, outer=()):
        out = real(plan, steps, feeds, outer)
        return [np.nextafter(o, np.inf) for o in out]

    monkeypatch.setattr(Plan, "run_on", off_by_one_bit)
    for _ in range(DECIDED):
        s.run(None, {"x": x})
    assert s.plan.regions  # chosen; the next run checks them
    s.run(None, {"x": x})
    choice = s.plan.region_choice
    assert choice["same"] is False and not choice["on"] and not s.plan.regions and len(s.plan.steps) == n
    monkeypatch.undo()
    np.testing.assert_array_equal(s.run(None, {"x": x})[0], _expected(x, n))


def test_an_explicit_setting_is_never_tuned():
    model = _chain(48, 4)
    x = np.ones((4, 4), np.float32)
    off, on = _session(model, False), _session(model, True)
    assert on.plan.regions and not off.plan.regions
    for _ in range(DECIDED + 1):
        off.run(None, {"x": x})
        on.run(None, {"x": x})
    assert off.plan.region_choice is None and on.plan.region_choice is None
    assert not off.plan.regions


def test_observed_runs_are_neither_counted_nor_timed():
    s = _session(_chain(48, 4))
    x = np.ones((4, 4), np.float32)
    for _ in range(DECIDED + 1):
        s.run(None, {"x": x}, RunOptions())
    assert s.plan.region_choice is None and not s.plan.regions


def test_runs_from_several_threads_across_the_switch_give_serial_results(monkeypatch):
    from runtime import region_tuner
    # Runs that overlap inflate the timed runs' walls (four threads on the suite's two cores: up to milliseconds),
    # which may leave the estimate short of MIN_GAIN; the switch itself is what this test needs.
    monkeypatch.setattr(region_tuner, "MIN_GAIN", 0.0)
    model, n = _chain(48, 4), 48
    s = _session(model)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((4, 4)).astype(np.float32) for _ in range(4)]
    errors, lock = [], threading.Lock()

    def work(x):
        try:
            for _ in range(20):
                np.testing.assert_array_equal(s.run(None, {"x": x})[0], _expected(x, n))
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            with lock:
                errors.append(e)

    threads = [threading.Thread(target=work, args=(x,)) for x in xs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert s.plan.region_choice is not None and s.plan.region_choice["on"] and s.plan.regions


def test_a_run_that_fails_on_the_regions_leaves_the_check_to_the_next(monkeypatch):
    from runtime import region_tuner
    from runtime.executor import Plan
    monkeypatch.setattr(region_tuner, "MIN_GAIN", 0.0)
    s = _session(_chain(48, 4))
    x = np.ones((4, 4), np.float32)
    for _ in range(DECIDED):
        s.run(None, {"x": x})
    real = Plan._run

    def fails_once(plan, *a, **k):
        monkeypatch.setattr(Plan, "_run", real)
        raise RuntimeError("a kernel failed")

    monkeypatch.setattr(Plan, "_run", fails_once)
    with pytest.raises(RuntimeError, match="a kernel failed"):
        s.run(None, {"x": x})
    assert s.plan.region_choice.get("same") is None  # not checked yet
    s.run(None, {"x": x})
    assert s.plan.region_choice["same"] is True
