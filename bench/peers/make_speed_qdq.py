#!/usr/bin/python3
"""A timing-only INT8 Q/DQ form of a model that `qeval calibrate` cannot quantize yet (opset < 13,
e.g. PP-OCRv4 detection, opset 11): every Conv gets QuantizeLinear -> DequantizeLinear on its input
(int8, per tensor, a fixed scale of 0.05: NOT calibrated, the outputs mean nothing) and int8 weights
behind DequantizeLinear (per tensor, max|w| / 127). qeval fuses each into its int8 conv, so the graph
times what a calibrated Q/DQ export would. Also writes a random input for bench_executor.

Usage: make_speed_qdq.py MODEL.onnx OUT.onnx INPUT_DIR N,C,H,W
"""
import os
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper


def main():
    src, dst, input_dir, shape = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    m = onnx.load(src)
    g = m.graph
    consts = {}  # Paddle2ONNX keeps weights in Constant nodes
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    consts[n.output[0]] = numpy_helper.to_array(a.t)
    inits = {i.name: i for i in g.initializer}
    nodes, new_inits, count = [], [], 0
    for n in g.node:
        if n.op_type == "Conv":
            w = n.input[1]
            wa = consts[w] if w in consts else numpy_helper.to_array(inits[w])
            ws = float(np.abs(wa).max()) / 127 or 1.0
            wq = np.clip(np.round(wa / ws), -127, 127).astype(np.int8)
            p = f"speed_qdq{count}_"
            new_inits += [numpy_helper.from_array(wq, p + "wq"),
                          numpy_helper.from_array(np.array(ws, np.float32), p + "ws"),
                          numpy_helper.from_array(np.array(0, np.int8), p + "wz"),
                          numpy_helper.from_array(np.array(0.05, np.float32), p + "xs"),
                          numpy_helper.from_array(np.array(0, np.int8), p + "xz")]
            nodes += [helper.make_node("QuantizeLinear", [n.input[0], p + "xs", p + "xz"], [p + "xq"], name=p + "q"),
                      helper.make_node("DequantizeLinear", [p + "xq", p + "xs", p + "xz"], [p + "xd"], name=p + "dq"),
                      helper.make_node("DequantizeLinear", [p + "wq", p + "ws", p + "wz"], [p + "wd"], name=p + "wdq")]
            n.input[0], n.input[1] = p + "xd", p + "wd"
            count += 1
        nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(new_inits)
    onnx.save(m, dst)
    os.makedirs(input_dir, exist_ok=True)
    dims = tuple(int(d) for d in shape.split(","))
    x = np.random.default_rng(1).standard_normal(dims).astype(np.float32)
    np.save(os.path.join(input_dir, g.input[0].name + ".npy"), x)
    print(f"{count} convs behind Q/DQ -> {dst}; input {g.input[0].name} {dims} -> {input_dir}")


if __name__ == "__main__":
    main()
