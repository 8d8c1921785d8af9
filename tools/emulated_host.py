"""onnxruntime's arithmetic on another x86 host, checked here: onnxruntime under QEMU's user-mode emulation of an
older CPU, this runtime compiled for that CPU, the outputs compared bit for bit.

onnxruntime picks its MLAS kernels by the CPU it runs on (AVX2, AVX-512, VNNI), and this runtime reproduces the
kernels of the host it runs on (``ops._simd.target_features``).  A host of one kind cannot run the other's
onnxruntime paths, but QEMU's ``qemu-x86_64 -cpu Haswell`` runs the installed onnxruntime as an AVX2-only CPU
would (QEMU 7.2 emulates AVX2 and FMA exactly, and no AVX-512), and ``NUMBA_CPU_NAME=haswell`` with
``NUMBA_CPU_FEATURES`` makes this runtime compile and choose its kernels as on that CPU (the instructions run
natively on any newer host).  Both run in subprocesses; nothing is shared but the files.

    python -m tools.emulated_host PKG [PKG ...] [--nodes [--golden NPZ]] [--cpu Haswell] [--prompt-tokens N]
                                  [--threads T]

- each ``PKG`` (an onnxruntime-genai package whose decoder takes ``input_ids``): the decoder's logits after a
  prompt of ``--prompt-tokens`` tokens (16) and after two more tokens, each step's caches and states fed back;
- ``--nodes``: single MatMulNBits nodes over bits 4 and 8, blocks 16 to 256, accuracy levels 0, 1 and 4, one and
  three rows, with and without zero points, K not a multiple of the block; then products whose result depends
  on onnxruntime's threads (129 rows: a last range of one row; a column split of MLAS's SGEMM).

onnxruntime runs on ``--threads`` intra-op threads (default: its own default, this host's physical cores), and
this runtime follows the same count (``ONNX_NUMBA_ORT_THREADS``).

Prints one line per case (``equal`` or the largest difference) and exits 1 if any differs.  Needs QEMU's user
mode (Debian: ``apt-get install qemu-user``); the first native run compiles every kernel for the emulated CPU
(minutes; Numba caches it per CPU).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

# the emulated CPUs: QEMU's model name -> (LLVM's CPU name, the features Numba compiles for)
CPUS = {
    "Haswell": ("haswell", "+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+popcnt,+lzcnt,+movbe,+sse4.2"),
}
PROMPT = [5, 17, 300, 41, 100, 7, 2, 9, 88, 123, 45, 78, 11, 12, 13, 1]
STEPS = [[31], [62]]


# -- one side of a comparison (run in a subprocess) ------------------------------------------------------------

def _decoder_side(api, pkg: str, out: str) -> None:
    """The prompt and the steps through ``pkg``'s decoder on ``api`` (onnxruntime or this runtime); logits saved."""
    import numpy as np
    import onnx
    cfg = json.load(open(os.path.join(pkg, "genai_config.json")))["model"]["decoder"]
    path = os.path.join(pkg, cfg.get("filename", "model.onnx"))
    graph = onnx.load(path, load_external_data=False).graph
    so = api.SessionOptions()
    so.intra_op_num_threads = int(os.environ["EMULATED_HOST_THREADS"])
    sess = api.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    types = {1: np.float32, 6: np.int32, 7: np.int64, 10: np.float16}
    inputs = {i.name: i for i in graph.input}
    outputs = [o.name for o in graph.output]

    def shape(i, past):
        dims = []
        for d in i.type.tensor_type.shape.dim:
            p = d.dim_param
            dims.append(d.dim_value if not p else 1 if "batch" in p else past if "sequence" in p
                        else cfg["head_size"])
        return dims

    carried, past, logits = {}, 0, []
    n = int(os.environ.get("EMULATED_HOST_PROMPT", len(PROMPT)))
    for ids in [(PROMPT * (n // len(PROMPT) + 1))[:n]] + STEPS:
        T, feeds = len(ids), {}
        for name, i in inputs.items():
            dt = types[i.type.tensor_type.elem_type]
            if name == "input_ids":
                feeds[name] = np.array([ids], dt)
            elif name == "attention_mask":
                feeds[name] = np.ones((1, past + T), dt)
            elif name == "position_ids":
                p = np.arange(past, past + T, dtype=dt)[None]
                rank = len(i.type.tensor_type.shape.dim)
                feeds[name] = p if rank == 2 else np.broadcast_to(p, shape(i, 0)[:-1] + [T]).copy()
            elif name in carried:
                feeds[name] = carried[name]
            elif name.startswith("past"):
                feeds[name] = np.zeros(shape(i, 0), dt)
            else:
                raise SystemExit(f"{pkg}: the decoder's input {name!r} is not one this check feeds")
        got = dict(zip(outputs, sess.run(None, feeds)))
        logits.append(np.asarray(got["logits"], np.float32)[0, -1])
        for o in outputs:  # present.N.key -> past_key_values.N.key, present.N.conv -> past.N.conv, ...
            if o.startswith("present"):
                twin = [n for n in inputs if n.startswith("past") and n.split(".", 1)[1:] == o.split(".", 1)[1:]]
                if len(twin) == 1:
                    carried[twin[0]] = got[o]
        past += T
    np.savez(out, *logits)


# Products whose result depends on onnxruntime's thread count, after the sweep (bits, block, level, M, K, N):
# 129 rows (with a thread pool, a last range of one row: MLAS's one-row kernels), and 8-bit codes at level 0
# through MLAS's SGEMM split along N (each part slicing K by its own width)
THREAD_CASES = [(4, 32, 4, 129, 200, 24), (4, 64, 4, 129, 300, 21), (4, 256, 4, 129, 600, 13),
                (8, 64, 4, 129, 300, 21), (4, 64, 0, 129, 300, 21), (4, 16, 1, 129, 200, 24),
                (8, 32, 0, 8, 3000, 100), (8, 64, 0, 4, 4000, 70)]


def nbits_cases(seed: int = 1):
    """The single-node MatMulNBits cases, in order: (description, model bytes, feeds), from ``seed``: the sweep,
    then ``THREAD_CASES`` with zero points."""
    import numpy as np
    rng = np.random.default_rng(seed)
    for bits in (4, 8):
        for bs in (16, 32, 64, 128, 256):
            for level in (4, 0, 1):
                for M in (1, 3):
                    for zp in (False, True):
                        K = int(rng.integers(2, 6)) * bs + (int(rng.integers(1, bs)) if rng.random() < 0.5 else 0)
                        N = int(rng.integers(8, 80))
                        yield _nbits_case(rng, bits, bs, level, M, K, N, zp)
    for bits, bs, level, M, K, N in THREAD_CASES:
        yield _nbits_case(rng, bits, bs, level, M, K, N, True)


def _nbits_case(rng, bits, bs, level, M, K, N, zp):
    """One MatMulNBits node of random codes, scales and zero points (``zp``) from ``rng``, and its feed."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    nb = (K + bs - 1) // bs
    q = rng.integers(0, 2 ** bits, (N, nb, bs), dtype=np.uint8)
    qb = (q[:, :, 0::2] | (q[:, :, 1::2] << 4)).astype(np.uint8) if bits == 4 else q
    sc = (rng.random(N * nb, np.float32) * 0.1 + 0.01).astype(np.float32)
    inits = [numpy_helper.from_array(qb, "B"), numpy_helper.from_array(sc, "S")]
    names = ["A", "B", "S"]
    if zp:
        z = rng.integers(0, 2 ** bits, (N, nb), dtype=np.uint8)
        if bits == 4:
            if nb % 2:
                z = np.concatenate([z, np.zeros((N, 1), np.uint8)], 1)
            z = (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8)
        inits.append(numpy_helper.from_array(z.reshape(-1), "Z"))
        names.append("Z")
    node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", K=K, N=N, bits=bits,
                            block_size=bs, accuracy_level=level)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [M, K])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [M, N])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    desc = f"MatMulNBits bits={bits} block={bs} level={level} M={M} zero_points={zp} K={K} N={N}"
    return desc, m.SerializeToString(), {"A": rng.standard_normal((M, K)).astype(np.float32)}


def _nodes_make(folder: str) -> None:
    """``nbits_cases`` as files: ``caseNNN.onnx``, its feeds ``.npz`` and its description ``.txt``."""
    import numpy as np
    for i, (desc, model, feeds) in enumerate(nbits_cases()):
        base = os.path.join(folder, f"case{i:03d}")
        with open(base + ".onnx", "wb") as f:
            f.write(model)
        np.savez(base + ".npz", **feeds)
        with open(base + ".txt", "w") as f:
            f.write(desc)


def _nodes_side(api, folder: str, tag: str) -> None:
    import numpy as np
    for path in sorted(glob.glob(os.path.join(folder, "case*.onnx"))):
        so = api.SessionOptions()
        so.intra_op_num_threads = int(os.environ["EMULATED_HOST_THREADS"])
        sess = api.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        np.savez(path[:-5] + f".{tag}.npz", *sess.run(None, dict(np.load(path[:-5] + ".npz"))))


def _side(argv) -> None:
    which, kind, target, out = argv
    if which == "native":
        import runtime as api  # first: it sets what numpy and Numba read when they load
    else:
        import onnxruntime as api
    if kind == "nodes":
        _nodes_side(api, target, which)
    else:
        _decoder_side(api, target, out)


# -- the driver ---------------------------------------------------------------------------------------------------

def _run(cmd, env=None) -> None:
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        lines = [x for x in r.stdout.splitlines() if "TCG doesn't support" not in x]
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed (status {r.returncode}):\n" + "\n".join(lines[-20:]))


def _compare(a_path: str, b_path: str):
    import numpy as np
    a, b = np.load(a_path), np.load(b_path)
    worst = 0.0
    for k in a.files:
        if not np.array_equal(a[k], b[k]):
            worst = max(worst, float(np.abs(a[k].astype(np.float64) - b[k]).max()))
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("packages", nargs="*", help="onnxruntime-genai package folders (decoders taking input_ids)")
    ap.add_argument("--nodes", action="store_true", help="also the single-node MatMulNBits sweep")
    ap.add_argument("--cpu", default="Haswell", choices=sorted(CPUS), help="the emulated CPU (QEMU's name)")
    ap.add_argument("--golden", metavar="NPZ", help="with --nodes: also write onnxruntime's outputs of the sweep "
                    "here, one array per case (caseNNN), for tests on hosts without QEMU")
    ap.add_argument("--prompt-tokens", type=int, default=len(PROMPT), metavar="N",
                    help=f"the prompt's length for each package (default {len(PROMPT)}; 129 gives a last range of "
                    "one row on several threads)")
    ap.add_argument("--threads", type=int, metavar="T", help="onnxruntime's intra-op threads, which this runtime "
                    "follows (default: onnxruntime's default, this host's physical cores)")
    ap.add_argument("--side", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side:
        _side(args.side)
        return 0
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        print("emulated_host: needs QEMU's user mode, qemu-x86_64 (Debian: apt-get install qemu-user)")
        return 2
    if not args.packages and not args.nodes:
        ap.error("name a package or --nodes")
    if args.prompt_tokens < 1 or (args.threads is not None and args.threads < 1):
        ap.error("--prompt-tokens and --threads take positive counts")
    if args.threads is None:
        from ops._mlas_attention import PHYSICAL_CORES
        args.threads = PHYSICAL_CORES
    llvm_cpu, features = CPUS[args.cpu]
    both = dict(os.environ, ONNX_NUMBA_ORT_THREADS=str(args.threads), EMULATED_HOST_THREADS=str(args.threads),
                EMULATED_HOST_PROMPT=str(args.prompt_tokens))
    env = dict(both, NUMBA_CPU_NAME=llvm_cpu, NUMBA_CPU_FEATURES=features)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    me = [sys.executable, "-m", "tools.emulated_host", "--side"]
    emulated = [qemu, "-cpu", args.cpu, sys.executable, os.path.abspath(__file__), "--side"]
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []
        if args.nodes:
            folder = os.path.join(tmp, "nodes")
            os.makedirs(folder)
            _nodes_make(folder)
            jobs.append(("nodes", folder, None))
        for i, pkg in enumerate(args.packages):
            jobs.append(("decoder", os.path.abspath(pkg), os.path.join(tmp, f"pkg{i}")))
        for kind, target, out in jobs:
            _run(emulated + ["ort", kind, target, f"{out}.ort.npz" if out else "-"], env=both)
            if kind == "nodes" and args.golden:
                import numpy as np
                cases = sorted(glob.glob(os.path.join(target, "case*.onnx")))
                np.savez_compressed(args.golden, ort_threads=np.int64(args.threads),
                                    **{os.path.basename(p)[:-5]: np.load(p[:-5] + ".ort.npz")["arr_0"]
                                       for p in cases})
            _run(me + ["native", kind, target, f"{out}.native.npz" if out else "-"], env=env)
            if kind == "nodes":
                for path in sorted(glob.glob(os.path.join(target, "case*.onnx"))):
                    worst = _compare(path[:-5] + ".ort.npz", path[:-5] + ".native.npz")
                    differ += worst > 0
                    print(f"{open(path[:-5] + '.txt').read()}: {'equal' if worst == 0 else f'max |d| {worst:.3e}'}")
            else:
                worst = _compare(f"{out}.ort.npz", f"{out}.native.npz")
                differ += worst > 0
                print(f"{target}: logits after a {args.prompt_tokens}-token prompt and {len(STEPS)} steps "
                      f"{'equal' if worst == 0 else f'differ, max |d| {worst:.3e}'}")
    print(f"emulated {args.cpu}: {differ} case(s) differ from onnxruntime")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
