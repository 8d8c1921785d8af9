"""Fuzz the runtime with mutated ONNX node-suite models, in a worker process that may die.

Each case takes a model of onnx's backend node suite (with its first input set) and applies one mutation:
an attribute changed (ints, floats, lists, strings), a feed's shape or dtype changed, an input dropped, the
op type swapped for another of the suite, or bytes of the serialized model flipped.  A worker process loads
and runs it natively and reports one outcome per case:

- ``success`` (then compared with onnxruntime and ``onnx.reference``: ``mismatch`` when those two agree with
  each other and the runtime does not),
- ``named`` (one of the project's errors, ``runtime.errors.OnnxNumbaError``; counted apart when onnxruntime
  runs the same case, a figure of what the runtime refuses that onnxruntime accepts),
- ``internal`` (any other exception: a defect, the message should name what was wrong),
- ``crash`` (the worker died) and ``hang`` (no answer within ``--timeout`` seconds: the worker is killed).  Each
  run is told to stop (``RunOptions.terminate``) after ``TERMINATE_AFTER`` seconds, so a model that defines an
  endless run ends as a named ``RunTerminatedError``, and a hang is a runtime that did not stop.

The worker reports the runtime's outcome before it runs the references, so a crash of onnxruntime on a case
(it dies on some) is told apart from one of the runtime's.  A crash, hang, internal exception or mismatch
saves its model and feeds under ``--out`` as a reproducer (so does a case refused here that onnxruntime runs).

    python -m tools.fuzz --cases 30000 --seed 1 --out /tmp/fuzz [--timeout 20]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pickle
import random
import select
import signal
import struct
import threading
import subprocess
import sys
import time

# Outcomes whose cases are saved as reproducers (the last, a coverage gap rather than a defect, to study them).
SAVED = ("internal", "mismatch", "crash", "hang", "named, onnxruntime ran it")
TERMINATE_AFTER = 5.0  # seconds before a run is told to stop (the per-case timeout must be longer)
OUTCOMES = ("success", "named", "named, onnxruntime ran it", "internal", "mismatch", "crash", "hang")


# -- cases ---------------------------------------------------------------------------------------------------------
def suite_models() -> list:
    """(name, model bytes, feeds) of every onnx node-suite test whose inputs are all tensors."""
    import warnings
    import numpy as np
    from onnx.backend.test.loader import load_node_model_tests
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_node_model_tests()
    out = []
    for c in cases:
        if not c.data_sets or c.model is None:
            continue
        inputs = c.data_sets[0][0]
        names = [i.name for i in c.model.graph.input if i.name not in {t.name for t in c.model.graph.initializer}]
        if len(inputs) != len(names) or not all(isinstance(x, np.ndarray) for x in inputs):
            continue
        out.append((c.name, c.model.SerializeToString(), dict(zip(names, inputs))))
    return out


def _mutate_attr(rng, node):
    from onnx import AttributeProto
    if not node.attribute:
        return False
    a = rng.choice(list(node.attribute))
    if a.type == AttributeProto.INT:
        a.i = rng.choice([-2, -1, 0, 1, 2, 3, 7, 1 << 20, -(1 << 31), a.i + 1, a.i - 1])
    elif a.type == AttributeProto.FLOAT:
        a.f = rng.choice([0.0, -1.0, 1e30, float("nan"), float("inf"), a.f * 2])
    elif a.type == AttributeProto.INTS:
        vals = list(a.ints)
        op = rng.randrange(3)
        if op == 0 and vals:
            vals[rng.randrange(len(vals))] = rng.choice([-3, -1, 0, 5, 1 << 20])
        elif op == 1:
            vals.append(rng.choice([0, 1, -1, 2]))
        elif vals:
            vals.pop()
        del a.ints[:]
        a.ints.extend(vals)
    elif a.type == AttributeProto.STRING:
        a.s = rng.choice([b"", b"??", b"..nii ->...i", a.s[::-1], a.s + b"x"])
    elif a.type == AttributeProto.FLOATS and a.floats:
        a.floats[rng.randrange(len(a.floats))] = rng.choice([float("nan"), -1.0, 0.0, 1e30])
    else:
        return False
    return True


def make_case(rng: random.Random, models: list, op_types: list):
    """(kind, source test, model bytes, feeds) of one mutated case; None when the mutation does not apply."""
    import numpy as np
    import onnx
    source, blob, feeds = rng.choice(models)
    model = onnx.load_from_string(blob)
    feeds = dict(feeds)
    kind = rng.choice(["attr", "attr", "shape", "dtype", "drop", "op", "bytes"])
    nodes = list(model.graph.node)
    if not nodes:
        return None
    node = rng.choice(nodes)
    if kind == "attr":
        if not _mutate_attr(rng, node):
            return None
    elif kind == "shape" and feeds:
        name = rng.choice(list(feeds))
        x = feeds[name]
        shape = list(x.shape) or [1]
        ax = rng.randrange(len(shape))
        shape[ax] = rng.choice([0, 1, shape[ax] + 1, max(shape[ax] - 1, 0)])
        if rng.random() < 0.3:
            shape.append(1)
        n = int(np.prod(shape))
        flat = np.resize(x.reshape(-1), n) if x.size else np.zeros(n, x.dtype)
        feeds[name] = flat.reshape(shape).astype(x.dtype)
    elif kind == "dtype" and feeds:
        name = rng.choice(list(feeds))
        if feeds[name].dtype == object:
            return None
        feeds[name] = feeds[name].astype(rng.choice([np.float32, np.float64, np.int64, np.int32, np.uint8, bool]))
    elif kind == "drop" and node.input:
        k = rng.randrange(len(node.input))
        node.input[k] = ""
    elif kind == "op":
        node.op_type = rng.choice(op_types)
    elif kind == "bytes":
        b = bytearray(model.SerializeToString())
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return kind, source, bytes(b), feeds
    else:
        return None
    return kind, source, model.SerializeToString(), feeds


# -- the worker ----------------------------------------------------------------------------------------------------
def _agree(a, b) -> bool:
    import numpy as np
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(map(_agree, a, b))
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype == object or b.dtype == object:
        return a.tolist() == b.tolist()
    if a.dtype.kind in "fc" or b.dtype.kind in "fc":
        return bool(np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-3, atol=1e-4, equal_nan=True))
    return bool(np.array_equal(a, b))


_PROTO = []  # the worker's answer channel: the original stdout, kept apart from what libraries print


def _send(obj) -> None:
    _PROTO[0].write(json.dumps(obj) + "\n")
    _PROTO[0].flush()


def worker() -> None:
    """Read pickled cases from stdin (length-prefixed); answer each with one or two JSON lines."""
    import warnings
    warnings.filterwarnings("ignore")
    _PROTO.append(os.fdopen(os.dup(1), "w"))
    os.dup2(2, 1)  # onnxruntime prints banners to stdout: they go where stderr goes
    sys.stdout = sys.stderr
    import runtime
    from runtime.errors import OnnxNumbaError
    stdin = sys.stdin.buffer
    while True:
        head = stdin.read(4)
        if len(head) < 4:
            return
        kind, name, model, feeds = pickle.loads(stdin.read(struct.unpack("<I", head)[0]))
        if kind == "selftest":  # the harness's own test: a worker that dies, or one that never answers
            if name == "crash":
                os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(1e6)
        # A model may define a run that never ends (a Loop without a trip count whose condition stays true):
        # RunOptions.terminate stops it after TERMINATE_AFTER seconds, so a hang is a runtime that did not stop.
        ro = runtime.RunOptions()
        timer = threading.Timer(TERMINATE_AFTER, setattr, (ro, "terminate", True))
        timer.start()
        try:
            ours = runtime.InferenceSession(model).run(None, feeds, ro)
            outcome, detail = "success", ""
        except OnnxNumbaError as e:
            outcome, detail = "named", f"{type(e).__name__}: {str(e)[:300]}"
        except Exception as e:  # noqa: BLE001 - what the fuzzer is for
            outcome, detail = "internal", f"{type(e).__name__}: {str(e)[:300]}"
        timer.cancel()
        _send({"ours": outcome, "detail": detail})
        if outcome == "named":  # does onnxruntime run what the runtime refused?  (a coverage figure, not a defect)
            try:
                import onnxruntime
                so = onnxruntime.SessionOptions()
                so.log_severity_level = 4
                onnxruntime.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)
                _send({"final": "named, onnxruntime ran it"})
            except Exception:  # noqa: BLE001
                _send({"final": "named"})
            continue
        if outcome != "success":
            continue
        verdict = "success"
        try:  # references may fail or die on the case: then there is nothing to compare with
            import onnxruntime
            from onnx import load_from_string
            from onnx.reference import ReferenceEvaluator
            so = onnxruntime.SessionOptions()
            so.log_severity_level = 4
            theirs = onnxruntime.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)
            ref = ReferenceEvaluator(load_from_string(model)).run(None, feeds)
            if len(theirs) == len(ref) == len(ours) and all(map(_agree, theirs, ref)) \
                    and not all(map(_agree, ours, theirs)):
                verdict = "mismatch"
        except Exception:  # noqa: BLE001
            pass
        _send({"final": verdict})


class Worker:
    """The worker process, restarted after it dies or hangs."""

    def __init__(self):
        self.p = None

    def start(self):
        self._buf = b""
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd()] + sys.path))
        self.p = subprocess.Popen([sys.executable, "-m", "tools.fuzz", "--worker"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)

    def stop(self):
        if self.p is not None:
            self.p.kill()
            self.p.wait()
            self.p = None

    def _line(self, deadline):
        """One JSON line, None when the worker died, 'hang' when the deadline passed."""
        fd = self.p.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return "hang"
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def run(self, case, timeout: float) -> tuple[str, str]:
        if self.p is None:
            self.start()
        blob = pickle.dumps(case)
        try:
            self.p.stdin.write(struct.pack("<I", len(blob)) + blob)
            self.p.stdin.flush()
        except BrokenPipeError:
            self.stop()
            return "crash", "the worker died before the case"
        first = self._line(time.monotonic() + timeout)
        if first is None or first == "hang":
            self.stop()
            return ("crash", "the worker died") if first is None else ("hang", f"no answer in {timeout} s")
        if first["ours"] not in ("success", "named"):
            return first["ours"], first["detail"]
        final = self._line(time.monotonic() + timeout)
        if final is None or final == "hang":  # a reference died or hung: the runtime's own outcome stands
            self.stop()
            return first["ours"], first["detail"] or "a reference died or hung"
        return final["final"], first["detail"]


def campaign(n: int, seed: int, out: str | None, timeout: float = 20.0, log=print) -> collections.Counter:
    """Run ``n`` cases; return the count of each outcome (reproducers under ``out``)."""
    rng = random.Random(seed)
    models = suite_models()
    import onnx
    op_types = sorted({n.op_type for _, blob, _ in models for n in onnx.load_from_string(blob).graph.node})
    counts = collections.Counter()
    w = Worker()
    done = 0
    t0 = time.time()
    try:
        while done < n:
            case = make_case(rng, models, op_types)
            if case is None:
                continue
            outcome, detail = w.run(case, timeout)
            counts[outcome] += 1
            done += 1
            if outcome in SAVED and out:
                os.makedirs(out, exist_ok=True)
                with open(os.path.join(out, f"{outcome}_{done:06d}_{case[1]}.pkl"), "wb") as f:
                    pickle.dump({"kind": case[0], "source": case[1], "model": case[2], "feeds": case[3],
                                 "detail": detail}, f)
            if outcome in ("internal", "mismatch", "crash", "hang"):
                log(f"[{done}] {outcome} {case[0]} {case[1]}: {detail}")
            if done % 1000 == 0:
                log(f"{done} cases, {time.time() - t0:.0f} s: {dict(counts)}")
    finally:
        w.stop()
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--out", default=None, help="folder for reproducers")
    a = ap.parse_args(argv)
    if a.worker:
        worker()
        return 0
    t0 = time.time()
    counts = campaign(a.cases, a.seed, a.out, a.timeout)
    print(f"{a.cases} cases in {time.time() - t0:.0f} s: " + ", ".join(f"{k} {counts[k]}" for k in OUTCOMES))
    return 0 if not any(counts[k] for k in ("internal", "mismatch", "crash", "hang")) else 1


if __name__ == "__main__":
    sys.exit(main())
