#!/usr/bin/python3
"""Quantization forms the ONNX 1.12 node tests lack (opset 19 float8 + saturate, opset 21 blocked and
16-bit, ModelOpt's FP8 forms, ONNX Runtime's quantizer outputs: per-channel QLinearConv/QLinearMatMul,
*Integer with zero points, dynamic quantization): small models, inputs and ONNX Runtime's outputs
in tests/data/qdq/."""

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
    # ONNX Runtime's quantizer forms beyond the node tests: QLinearConv with per-channel int8
    # weights, int32 bias, groups, strides and padding; QLinearMatMul u8 x s8 with per-column
    # scales; ConvInteger / MatMulInteger with nonzero weight zero points; dynamic quantization.
    x = rng.randint(0, 256, size=(2, 4, 7, 6)).astype(np.uint8)
    w = rng.randint(-128, 128, size=(6, 2, 3, 3)).astype(np.int8)
    w[0] = -128
    nodes = [helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], name="qconv",
                              group=2, strides=[2, 1], pads=[1, 0, 1, 2])]
    inits = [raw_tensor("xs", FLOAT, [], np.array(0.02, np.float32)), raw_tensor("xz", UINT8, [], np.array(120, np.uint8)),
             raw_tensor("w", INT8, [6, 2, 3, 3], w), raw_tensor("ws", FLOAT, [6], rng.uniform(0.001, 0.01, 6).astype(np.float32)),
             raw_tensor("wz", INT8, [6], np.zeros(6, np.int8)), raw_tensor("ys", FLOAT, [], np.array(0.05, np.float32)),
             raw_tensor("yz", UINT8, [], np.array(100, np.uint8)),
             raw_tensor("b", 6, [6], rng.randint(-2000, 2000, 6).astype(np.int32))]
    out["ort_qlinearconv_perchannel"] = (model(nodes, [vi("x", UINT8, [2, 4, 7, 6])], [vi("y", UINT8, [2, 6, 4, 6])], inits, 13),
                                         {"x": x})

    a = rng.randint(0, 256, size=(2, 5, 19)).astype(np.uint8)
    b = rng.randint(-128, 128, size=(19, 7)).astype(np.int8)
    nodes = [helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"], name="qmatmul")]
    inits = [raw_tensor("as", FLOAT, [], np.array(0.03, np.float32)), raw_tensor("az", UINT8, [], np.array(131, np.uint8)),
             raw_tensor("b", INT8, [19, 7], b), raw_tensor("bs", FLOAT, [7], rng.uniform(0.002, 0.02, 7).astype(np.float32)),
             raw_tensor("bz", INT8, [7], np.zeros(7, np.int8)), raw_tensor("ys", FLOAT, [], np.array(0.2, np.float32)),
             raw_tensor("yz", UINT8, [], np.array(125, np.uint8))]
    out["ort_qlinearmatmul_percolumn"] = (model(nodes, [vi("a", UINT8, [2, 5, 19])], [vi("y", UINT8, [2, 5, 7])], inits, 13),
                                          {"a": a})

    x = rng.randint(0, 256, size=(1, 3, 6, 5)).astype(np.uint8)
    w = rng.randint(0, 256, size=(4, 3, 2, 2)).astype(np.uint8)
    nodes = [helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], name="convint", pads=[1, 1, 0, 0], dilations=[2, 1])]
    inits = [raw_tensor("w", UINT8, [4, 3, 2, 2], w), raw_tensor("xz", UINT8, [], np.array(7, np.uint8)),
             raw_tensor("wz", UINT8, [], np.array(140, np.uint8))]
    out["ort_convinteger_zero_points"] = (model(nodes, [vi("x", UINT8, [1, 3, 6, 5])], [vi("y", 6, [1, 4, 5, 6])], inits, 13),
                                          {"x": x})

    a = rng.randint(0, 256, size=(3, 33)).astype(np.uint8)
    b = rng.randint(0, 256, size=(33, 40)).astype(np.uint8)
    nodes = [helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"], name="matmulint")]
    inits = [raw_tensor("b", UINT8, [33, 40], b), raw_tensor("az", UINT8, [], np.array(128, np.uint8)),
             raw_tensor("bz", UINT8, [40], rng.randint(0, 256, 40).astype(np.uint8))]
    out["ort_matmulinteger_percolumn_zp"] = (model(nodes, [vi("a", UINT8, [3, 33])], [vi("y", 6, [3, 40])], inits, 13),
                                             {"a": a})

    # Dynamic quantization as ONNX Runtime's quantize_dynamic writes a MatMul.
    x = rng.normal(0, 2, size=(4, 24)).astype(np.float32)
    w = rng.randint(-127, 128, size=(24, 9)).astype(np.int8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql"),
             helper.make_node("MatMulInteger", ["xq", "w", "xz"], ["acc"], name="mmi"),
             helper.make_node("Cast", ["acc"], ["accf"], name="cast", to=FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"], name="scale"),
             helper.make_node("Mul", ["accf", "s"], ["y"], name="rescale")]
    inits = [raw_tensor("w", INT8, [24, 9], w), raw_tensor("ws", FLOAT, [], np.array(0.01, np.float32))]
    out["ort_dynamic_matmul"] = (model(nodes, [vi("x", FLOAT, [4, 24])], [vi("y", FLOAT, [4, 9]), vi("xq", UINT8, [4, 24])],
                                       inits, 13), {"x": x})
    # A hand-built QDQ graph (TensorRT's convention: symmetric int8, weights per output channel;
    # and ONNX Runtime's: uint8 activations with zero points): Conv -> Relu -> Flatten -> MatMul ->
    # Add, the Conv and MatMul inputs behind Q/DQ, the output quantized too. ORT computes it as written (DQ to float, float
    # Conv/MatMul); qeval fuses the Conv and the MatMul into int8 x int8 -> int32 kernels. The C++ test
    # (QdqFusion.*) asks for agreement within one quantization step of the output.
    for act, aname in [(INT8, "s8"), (UINT8, "u8")]:
        x = rng.normal(0, 1, size=(2, 3, 8, 8)).astype(np.float32)
        w1 = rng.normal(0, 0.3, size=(4, 3, 3, 3)).astype(np.float32)
        s1 = (np.abs(w1).reshape(4, -1).max(axis=1) / 127).astype(np.float32)
        w1q = np.clip(np.rint(w1 / s1[:, None, None, None]), -127, 127).astype(np.int8)
        b1 = rng.normal(0, 0.1, size=4).astype(np.float32)
        w2 = rng.normal(0, 0.1, size=(256, 10)).astype(np.float32)
        s2 = (np.abs(w2).max(axis=0) / 127).astype(np.float32)
        w2q = np.clip(np.rint(w2 / s2[None, :]), -127, 127).astype(np.int8)
        b2 = rng.normal(0, 0.1, size=10).astype(np.float32)
        zp = (lambda v: np.array(v if act == INT8 else v + 128, NP[act]))
        nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="x_q"),
                 helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="x_dq"),
                 helper.make_node("DequantizeLinear", ["w1q", "w1s"], ["w1d"], name="w1_dq", axis=0),
                 helper.make_node("Conv", ["xd", "w1d", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
                 helper.make_node("Flatten", ["r1"], ["f"], name="flatten", axis=1),
                 helper.make_node("QuantizeLinear", ["f", "as", "az"], ["fq"], name="f_q"),
                 helper.make_node("DequantizeLinear", ["fq", "as", "az"], ["fd"], name="f_dq"),
                 helper.make_node("DequantizeLinear", ["w2q", "w2s"], ["w2d"], name="w2_dq", axis=1),
                 helper.make_node("MatMul", ["fd", "w2d"], ["mm"], name="fc"),
                 helper.make_node("Add", ["mm", "b2"], ["fcb"], name="fc_bias"),
                 helper.make_node("QuantizeLinear", ["fcb", "ys", "yz"], ["yq"], name="y_q"),
                 helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"], name="y_dq")]
        inits = [raw_tensor("xs", FLOAT, [], np.array(0.025, np.float32)), raw_tensor("xz", act, [], zp(0 if act == INT8 else -3)),
                 raw_tensor("w1q", INT8, [4, 3, 3, 3], w1q), raw_tensor("w1s", FLOAT, [4], s1),
                 raw_tensor("b1", FLOAT, [4], b1),
                 raw_tensor("as", FLOAT, [], np.array(0.02, np.float32)), raw_tensor("az", act, [], zp(0 if act == INT8 else -128)),
                 raw_tensor("w2q", INT8, [256, 10], w2q), raw_tensor("w2s", FLOAT, [10], s2),
                 raw_tensor("b2", FLOAT, [10], b2),
                 raw_tensor("ys", FLOAT, [], np.array(0.01, np.float32)), raw_tensor("yz", act, [], zp(0 if act == INT8 else 5))]
        out[f"qdq_conv_matmul_{aname}"] = (model(nodes, [vi("x", FLOAT, [2, 3, 8, 8])], [vi("y", FLOAT, [2, 10])], inits, 13),
                                           {"x": x})
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
