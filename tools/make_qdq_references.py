#!/usr/bin/python3
"""Q/DQ forms the ONNX 1.12 node tests lack (opset 19 float8 + saturate, opset 21 blocked and 16-bit,
ModelOpt's FP8 forms): small models, inputs and ONNX Runtime's outputs in tests/data/qdq/."""

# Usage (from the repository root):
#   (cd tools/ort && npm ci --ignore-scripts)      # once
#   /usr/bin/python3 tools/make_qdq_references.py
#
# Debian's onnx is 1.12, which predates float8 and opset 21: the models are written with the raw
# type codes (FLOAT8E4M3FN = 17, FLOAT8E4M3FNUZ = 18, FLOAT8E5M2 = 19, FLOAT8E5M2FNUZ = 20) and
# without the checker; ONNX Runtime 1.30 (tools/ort) validates and runs them.
#
# Writes, per case, tests/data/qdq/<case>/:
#   model.onnx, inputs/<name>.npy, outputs/<name>.npy (ONNX Runtime, CPU EP, no graph optimization)
#   reference.txt (only for trt_*): the case whose ORT outputs are this model's reference; ORT cannot
#   run the trt-domain ops, which are the same computation as standard opset-19 Q/DQ with a
#   FLOAT8E4M3FN zero point (ModelOpt's own converter rewrites them that way).
# Float8 results leave the graph through Cast(to=FLOAT), which is exact, since ORT's JavaScript API
# has no float8 tensors.

import os
import shutil
import subprocess

import numpy as np
import onnx
from onnx import helper, TensorProto

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_ROOT = os.path.join(REPO, "tests", "data", "qdq")
ORT_RUNNER = os.path.join(REPO, "tools", "ort", "run_reference.js")

E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ = 17, 18, 19, 20
FLOAT, UINT8, INT8, UINT16, INT16, FLOAT16 = 1, 2, 3, 4, 5, 10
NP = {FLOAT: np.float32, UINT8: np.uint8, INT8: np.int8, UINT16: np.uint16, INT16: np.int16, FLOAT16: np.float16}


def raw_tensor(name, onnx_type, dims, data):
    """A TensorProto with raw little-endian bytes (float8 tensors: their one-byte codes)."""
    t = TensorProto()
    t.name = name
    t.data_type = onnx_type
    t.dims.extend(dims)
    t.raw_data = np.ascontiguousarray(data).tobytes()
    return t


def model(nodes, inputs, outputs, initializers, opset, domains=()):
    graph = helper.make_graph(nodes, "qdq", inputs, outputs, initializer=initializers)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)] +
                          [helper.make_opsetid(d, 1) for d in domains])
    m.ir_version = 10 if opset >= 21 else 9
    return m


def vi(name, onnx_type, dims):
    return helper.make_tensor_value_info(name, onnx_type, dims)


def probe_values(rng, n, amax):
    """Random values over [-1.5 amax, 1.5 amax] plus the edge cases: ties, overflow, inf, NaN, -0,
    values that round to the smallest subnormals."""
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 0.5, 1.5, 2.5, -2.5, 1e-7, -1e-7],
                     dtype=np.float32) * np.float32(1)
    rand = rng.uniform(-1.5 * amax, 1.5 * amax, size=n - len(edges)).astype(np.float32)
    return np.concatenate([edges, rand]).astype(np.float32)


def cases():
    rng = np.random.RandomState(20240521)
    out = {}

    # Opset 19 float8 Q with saturate on/off, per-tensor and per-axis, then exact Cast to float.
    for fmt, fname, fmax in [(E4M3FN, "e4m3fn", 448.0), (E5M2, "e5m2", 57344.0), (E4M3FNUZ, "e4m3fnuz", 240.0),
                             (E5M2FNUZ, "e5m2fnuz", 57344.0)]:
        for sat in (1, 0):
            x = probe_values(rng, 48, fmax * 0.5).reshape(4, 12)
            scale = np.array(0.5, np.float32)
            if fmt == E4M3FN and not sat:
                # ORT and onnx.reference map |x / scale| in [480, 496) to 448 when not saturating
                # (the mantissa is truncated before rounding); the Cast-19 table, and qeval, round
                # first: 480 overflows to NaN. Keep those values out of the comparison.
                q = np.abs(x / scale)
                x[(q >= 480) & (q < 496)] = np.float32(100.0)
            if fmt == E5M2 and not sat:
                # Likewise ORT gives NaN (code 0x7F) for |x / scale| in [61440, 65536), which rounds
                # to 65536: an overflow, +-inf for E5M2 (code 0x7C) in the Cast-19 table and qeval.
                q = np.abs(x / scale)
                x[(q >= 61440) & (q < 65536)] = np.float32(100.0)
            nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], name="q", saturate=sat),
                     helper.make_node("Cast", ["q"], ["y"], name="cast", to=FLOAT)]
            inits = [raw_tensor("scale", FLOAT, [], scale), raw_tensor("zp", fmt, [], np.array(0, np.uint8))]
            out[f"q19_{fname}_sat{sat}"] = (model(nodes, [vi("x", FLOAT, [4, 12])], [vi("y", FLOAT, [4, 12])], inits, 19),
                                            {"x": x})

    # ModelOpt FP8 weights: per-channel (axis 0) E4M3FN Q -> DQ with FLOAT8E4M3FN zero points.
    w = rng.normal(0, 1, size=(6, 10)).astype(np.float32)
    w_scale = (np.abs(w).max(axis=1) / 448.0).astype(np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["w", "ws", "wzp"], ["wq"], name="wq", axis=0),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wzp"], ["y"], name="wdq", axis=0)]
    inits = [raw_tensor("ws", FLOAT, [6], w_scale), raw_tensor("wzp", E4M3FN, [6], np.zeros(6, np.uint8))]
    out["qdq19_e4m3fn_axis0"] = (model(nodes, [vi("w", FLOAT, [6, 10])], [vi("y", FLOAT, [6, 10])], inits, 19), {"w": w})

    # ModelOpt FP8 activations as standard Q/DQ (what the trt-domain ops are converted to), fp32 and
    # fp16 scales (fp16 in, fp16 out: TensorRT's strongly typed FP16 QDQ).
    x = probe_values(rng, 40, 6.0).reshape(2, 20)
    for st, sname in [(FLOAT, "f32"), (FLOAT16, "f16")]:
        scale = np.array(6.0 / 448.0, NP[st])
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q"),
                 helper.make_node("DequantizeLinear", ["q", "s"], ["y"], name="dq")]
        inits = [raw_tensor("s", st, [], scale), raw_tensor("zp", E4M3FN, [], np.array(0, np.uint8))]
        out[f"qdq19_e4m3fn_{sname}"] = (model(nodes, [vi("x", st, [2, 20])], [vi("y", st, [2, 20])], inits, 19),
                                        {"x": x.astype(NP[st])})
        trt_nodes = [helper.make_node("TRT_FP8QuantizeLinear", ["x", "s"], ["q"], name="q", domain="trt"),
                     helper.make_node("TRT_FP8DequantizeLinear", ["q", "s"], ["y"], name="dq", domain="trt")]
        out[f"trt_fp8_{sname}"] = (model(trt_nodes, [vi("x", st, [2, 20])], [vi("y", st, [2, 20])],
                                         [raw_tensor("s", st, [], scale)], 19, domains=("trt",)),
                                   {"x": x.astype(NP[st])}, f"qdq19_e4m3fn_{sname}")

    # Opset 21 blocked int8 / uint8 Q and DQ (block 4 along axis 1; the last block is short).
    x = rng.normal(0, 3, size=(3, 10)).astype(np.float32)
    x[0, :4] = [0.5, 1.5, 2.5, -2.5]  # ties at scale 1
    for qt, qname in [(INT8, "int8"), (UINT8, "uint8")]:
        scale = rng.uniform(0.02, 0.1, size=(3, 3)).astype(np.float32)
        scale[0, 0] = 1.0
        zp = (rng.randint(-20, 20, size=(3, 3)) if qt == INT8 else rng.randint(100, 150, size=(3, 3))).astype(NP[qt])
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q", axis=1, block_size=4),
                 helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="dq", axis=1, block_size=4)]
        inits = [raw_tensor("s", FLOAT, [3, 3], scale), raw_tensor("zp", qt, [3, 3], zp)]
        out[f"qdq21_blocked_{qname}"] = (model(nodes, [vi("x", FLOAT, [3, 10])],
                                               [vi("q", qt, [3, 10]), vi("y", FLOAT, [3, 10])], inits, 21), {"x": x})

    # Opset 21 16-bit types, per-axis along the last axis, with output_dtype instead of a zero point.
    x = rng.normal(0, 200, size=(2, 3, 4)).astype(np.float32)
    x[0, 0, 0] = 1e9
    x[0, 0, 1] = -1e9
    for qt, qname in [(INT16, "int16"), (UINT16, "uint16")]:
        scale = rng.uniform(0.001, 0.01, size=(4,)).astype(np.float32)
        zp = (np.array([-7, 0, 3, 1000]) if qt == INT16 else np.array([32768, 30000, 0, 65535])).astype(NP[qt])
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q", axis=-1),
                 helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="dq", axis=-1),
                 helper.make_node("QuantizeLinear", ["x", "s"], ["q_nozp"], name="q_nozp", axis=-1, output_dtype=qt)]
        inits = [raw_tensor("s", FLOAT, [4], scale), raw_tensor("zp", qt, [4], zp)]
        out[f"qdq21_{qname}"] = (model(nodes, [vi("x", FLOAT, [2, 3, 4])],
                                       [vi("q", qt, [2, 3, 4]), vi("y", FLOAT, [2, 3, 4]), vi("q_nozp", qt, [2, 3, 4])],
                                       inits, 21), {"x": x})
    return out


def main():
    if os.path.isdir(OUT_ROOT):
        shutil.rmtree(OUT_ROOT)
    for name, spec in cases().items():
        m, inputs = spec[0], spec[1]
        d = os.path.join(OUT_ROOT, name)
        os.makedirs(os.path.join(d, "inputs"))
        onnx.save(m, os.path.join(d, "model.onnx"))
        for k, v in inputs.items():
            np.save(os.path.join(d, "inputs", k + ".npy"), v)
        if len(spec) > 2:
            # ORT cannot run the trt-domain ops: the reference is the equivalent standard graph's output.
            with open(os.path.join(d, "reference.txt"), "w") as f:
                f.write(spec[2] + "\n")
            continue
        subprocess.run(["node", ORT_RUNNER, os.path.join(d, "model.onnx"), os.path.join(d, "inputs"),
                        os.path.join(d, "outputs")], check=True, stdout=subprocess.DEVNULL)
        print(name, "ok")


if __name__ == "__main__":
    main()
