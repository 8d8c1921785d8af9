"""How far accuracy-level-4 MatMulNBits moves when its input moves by one ulp: the numeric tolerance between two
implementations of an int4 package.

At accuracy_level 4 the activations are quantized to int8 per block before the integer product, so an input
element that sits near a rounding boundary flips to the next int8 code when it moves by one ulp, and the output
moves by a whole quantization step times a weight.  Float kernels that differ in their last bit (a layer norm
summed in another order) therefore give level-4 outputs that differ by orders of magnitude more than the float
product would, and greedy decoding of an int4 package can flip a near-tie where an fp32 package does not.

The script takes the first level-4 MatMulNBits of a package's decoder, feeds the whole model a prompt on
onnxruntime to capture that node's real input ``x``, and prints, for the node alone:

- ``ort(x) vs native(x)``: the two implementations on the same input;
- ``ort(x) vs ort(x + 1 ulp)``: onnxruntime against itself, the input moved up one ulp (``np.nextafter``);
- ``exact change``: how much the float64 product of the dequantized weight moves for the same input change.

Usage: python -m tools.level4_sensitivity --model PACKAGE [--prompt-ids 1,45,77,12]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _dequantized(node, inits):
    from onnx import helper, numpy_helper
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    K, N, bs, bits = a["K"], a["N"], a["block_size"], a.get("bits", 4)
    if bits != 4:
        return None
    nb = (K + bs - 1) // bs
    B = numpy_helper.to_array(inits[node.input[1]]).reshape(N, nb, bs // 2)
    sc = numpy_helper.to_array(inits[node.input[2]]).reshape(N, nb).astype(np.float64)
    codes = np.stack([B & 15, B >> 4], -1).reshape(N, nb, bs).astype(np.float64)
    if len(node.input) > 3 and node.input[3]:
        zp = numpy_helper.to_array(inits[node.input[3]])
        if zp.dtype != np.uint8:
            return None
        z = np.stack([zp & 15, zp >> 4], -1).reshape(N, -1)[:, :nb].astype(np.float64)
    else:
        z = np.full((N, nb), 8.0)
    return ((codes - z[:, :, None]) * sc[:, :, None]).reshape(N, nb * bs)[:, :K]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a GenAI package folder")
    p.add_argument("--prompt-ids", default="1,45,77,12,300,9")
    args = p.parse_args(argv)
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper
    from pipeline.metadata import load_package
    from runtime import InferenceSession

    path = load_package(args.model).decoder.filename
    m = onnx.load(path)
    inits = {i.name: i for i in m.graph.initializer}
    node = next((n for n in m.graph.node if n.op_type == "MatMulNBits" and any(
        a.name == "accuracy_level" and a.i == 4 for a in n.attribute)), None)
    if node is None:
        raise SystemExit(f"{args.model}: no MatMulNBits with accuracy_level 4")
    m.graph.output.extend([helper.make_tensor_value_info(node.input[0], TensorProto.FLOAT, None)])
    full = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.array([[int(t) for t in args.prompt_ids.split(",")]], np.int64)
    with open(os.path.join(args.model, "genai_config.json")) as f:
        head_size = int(json.load(f)["model"]["decoder"]["head_size"])
    from tools.int4_accuracy import feeds as prefill_feeds
    feeds = prefill_feeds(full.get_inputs(), ids[0], head_size)
    x = full.run([node.input[0]], feeds)[0]

    g = helper.make_graph([node], "one", [helper.make_tensor_value_info(node.input[0], TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)],
                          initializer=[inits[n] for n in node.input[1:] if n])
    one = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    one.ir_version = 9
    blob = one.SerializeToString()
    o = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    n = InferenceSession(blob)
    x_up = np.nextafter(x, np.float32(np.inf)).astype(np.float32)
    y_ort, y_ort_up = o.run(None, {node.input[0]: x})[0], o.run(None, {node.input[0]: x_up})[0]
    y_nat = n.run(None, {node.input[0]: x})[0]
    print(f"node {node.name!r}: input {list(x.shape)}, output {list(y_ort.shape)}, max|output| "
          f"{np.abs(y_ort).max():.3e}")
    print(f"ort(x) vs native(x):       max|diff| {np.abs(y_ort - y_nat).max():.3e}")
    print(f"ort(x) vs ort(x + 1 ulp):  max|diff| {np.abs(y_ort - y_ort_up).max():.3e}")
    w = _dequantized(node, inits)
    if w is not None:
        dx = x_up.reshape(-1, w.shape[1]).astype(np.float64) - x.reshape(-1, w.shape[1])
        print(f"exact change (float64):    max|diff| {np.abs(dx @ w.T).max():.3e}")


if __name__ == "__main__":
    main()
