#!/usr/bin/python3
"""Real ONNX Runtime QOperator (QLinear*) graphs of PaddleOCR's detector and angle classifier.

ONNX Runtime's quantizer (`quantize_static`) is Python-only and not packaged for Debian, but ORT's
graph optimizer, which the npm package has, is what turns its Q/DQ output into the QOperator form.
This script writes the Q/DQ graph the quantizer would write, by its conventions, and lets ORT
(tools/ort/qdq_to_qlinear.js, onnxruntime-node 1.30) do the rest:

  1. the float model (third_party/models/ppocr) with its input shape fixed, through ORT's 'basic'
     optimizer (what `quant_pre_process` does: constants folded, BatchNormalization into Conv),
     raised to opset 13 (per-channel DequantizeLinear needs it; Clip-6's attributes become inputs);
  2. activation ranges: plain min/max over four calibration images (rendered text, as
     tools/make_real_model_references.py draws it), computed by ORT itself on the graph with every
     float value made an output (ORT's MinMax calibrator; the test image is not among them);
  3. the ORT-convention Q/DQ graph ("QDQ" format, ORT's defaults): uint8 asymmetric activations
     (scale = (max(rmax, 0) - min(rmin, 0)) / 255, zero point = round(-rmin / scale)), int8 symmetric
     per-channel weights (scale = absmax / 127, values in [-127, 127]), int32 biases at
     x_scale * w_scale; a Q -> DQ pair on every input AND output of each quantized op (Conv,
     ConvTranspose, Gemm, MatMul, Add, Mul, Concat, Sigmoid, LeakyRelu, GlobalAveragePool,
     AveragePool, MaxPool, Resize, Reshape, Softmax); MaxPool, Resize and Reshape outputs share their
     input's scale; Relu and Clip after a quantized producer are removed, the producer's output
     taking their range (ORT's QDQRemovableActivation); HardSigmoid, Div, BatchNormalization stay
     float between DQ and Q;
  4. ORT's optimizer at level 'extended' on that graph -> the QLinear graph (ORT's own file);
  5. ORT's outputs of both graphs on the committed test input (optimizations off, one thread).

Writes tests/data/real_models/<case>_qlinear/{qlinear.onnx, qdq.onnx, weights.bin (the int8
weights both graphs read as external data), ort_outputs/, ort_qdq_outputs/} for case ppocr_det and ppocr_cls (the recognizer's int8 graph, ~2.7 MB, is over
the test data budget). Usage (from the repository root; needs scripts/fetch_models.sh's models and
`cd tools/ort && npm ci --ignore-scripts`):

  /usr/bin/python3 tools/make_ort_qlinear_models.py
"""

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_real_model_references import render, to_input  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(REPO, "third_party", "models", "ppocr")
DATA = os.path.join(REPO, "tests", "data", "real_models")
JS = os.path.join(REPO, "tools", "ort", "qdq_to_qlinear.js")
RUN = os.path.join(REPO, "tools", "ort", "run_reference.js")

DET_NORM = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
CLS_NORM = ([0.5] * 3, [0.5] * 3)
CASES = {
    "ppocr_det": ("ch_PP-OCRv4_det_infer.onnx", [1, 3, 96, 256], lambda lines: to_input(render(256, 96, lines, 28),
                                                                                         *DET_NORM),
                  [[(10, 8, "Calibrate 0123", (10, 10, 10)), (20, 50, "ranges: min/max", (90, 20, 20))],
                   [(40, 30, "PaddleOCR v4", (30, 30, 90))],
                   [(6, 4, "ABCDEFGHIJ", (0, 0, 0)), (6, 40, "klmnopqrst", (60, 60, 60))],
                   [(30, 20, "uint8 / int8", (20, 90, 20)), (100, 60, "x=42", (5, 5, 5))]]),
    "ppocr_cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", [1, 3, 48, 192],
                  lambda lines: to_input(render(192, 48, lines, 28), *CLS_NORM),
                  [[(6, 8, "calibrate", (10, 10, 10))], [(20, 6, "Paddle 42", (40, 40, 120))],
                   [(4, 10, "min max", (0, 0, 0))], [(10, 8, "ONNX RT", (90, 30, 30))]]),
}

QUANTIZED_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Mul", "Concat", "Sigmoid", "LeakyRelu",
                 "GlobalAveragePool", "AveragePool", "MaxPool", "Resize", "Reshape", "Softmax"}
SAME_SCALE_AS_INPUT = {"MaxPool", "Resize", "Reshape"}
REMOVABLE = {"Relu", "Clip"}
# Inputs of each op that carry activations (the rest: shapes, scales, roi: left as they are).
ACTIVATION_INPUTS = {"Resize": [0], "Reshape": [0], "Conv": [0], "ConvTranspose": [0], "Gemm": [0], "MatMul": [0, 1]}
WEIGHT_AXIS = {"Conv": 0, "ConvTranspose": 1}


def node_js(*args):
    subprocess.run(["node", JS, *args], check=True)


def prepare(src, shape, out):
    """Input shape fixed, ORT 'basic' optimization, opset 13."""
    m = onnx.load(src)
    for d, v in zip(m.graph.input[0].type.tensor_type.shape.dim, shape):
        d.Clear()
        d.dim_value = v
    fixed = out + ".fixed.onnx"
    onnx.save(m, fixed)
    node_js("optimize", fixed, out, "basic")
    m = onnx.load(out)
    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    for n in m.graph.node:
        if n.op_type == "Clip" and opset < 11:  # Clip-6: min/max attributes -> inputs
            lo = next((a.f for a in n.attribute if a.name == "min"), -3.4e38)
            hi = next((a.f for a in n.attribute if a.name == "max"), 3.4e38)
            names = [n.name + "_min", n.name + "_max"]
            m.graph.initializer.extend([numpy_helper.from_array(np.float32(lo), names[0]),
                                        numpy_helper.from_array(np.float32(hi), names[1])])
            del n.attribute[:]
            n.input.extend(names)
    del m.opset_import[:]
    m.opset_import.extend([helper.make_opsetid("", 13)])
    m = onnx.shape_inference.infer_shapes(m)
    onnx.checker.check_model(m)
    onnx.save(m, out)
    return m


def float_values(m):
    """Float activations (not initializers) in topological order."""
    inits = {i.name for i in m.graph.initializer}
    types = {v.name: v.type.tensor_type.elem_type for v in list(m.graph.value_info) + list(m.graph.output) +
             list(m.graph.input)}
    names = [i.name for i in m.graph.input]
    for n in m.graph.node:
        names += [o for o in n.output if o]
    return [v for v in names if v not in inits and types.get(v) == onnx.TensorProto.FLOAT]


def collect_ranges(m, work, case, calib_inputs):
    aug = onnx.ModelProto()
    aug.CopyFrom(m)
    have = {o.name for o in aug.graph.output}
    for v in float_values(m):
        if v not in have:
            aug.graph.output.append(helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT, None))
    path = os.path.join(work, case + ".augmented.onnx")
    onnx.save(aug, path)
    dirs = []
    for i, x in enumerate(calib_inputs):
        d = os.path.join(work, f"{case}.calib{i}")
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, m.graph.input[0].name + ".npy"), x)
        dirs.append(d)
    out = os.path.join(work, case + ".ranges.json")
    node_js("ranges", path, out, *dirs)
    with open(out) as f:
        return {k: (np.float32(v[0]), np.float32(v[1])) for k, v in json.load(f).items()}


def uint8_params(rmin, rmax):
    """ONNX Runtime's compute_scale_zp for asymmetric uint8 (float32 arithmetic, numpy's rint)."""
    rmin = np.minimum(np.float32(rmin), np.float32(0))
    rmax = np.maximum(np.float32(rmax), np.float32(0))
    if rmax == rmin:
        return np.float32(1.0), np.uint8(0)
    scale = np.float32((rmax - rmin) / np.float32(255))
    zp = np.rint(np.float32(0) - rmin / scale)
    return scale, np.uint8(np.clip(zp, 0, 255))


def quantize_weight(w, axis):
    """int8 symmetric per channel: scale = absmax / 127, values in [-127, 127]."""
    moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    absmax = np.abs(moved).max(axis=1).astype(np.float32)
    scale = np.where(absmax == 0, np.float32(1), absmax / np.float32(127)).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, scale


def make_qdq(m, ranges):
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    consumers = collections.defaultdict(list)
    producer = {}
    for n in g.node:
        for i in n.input:
            consumers[i].append(n)
        for o in n.output:
            producer[o] = n
    graph_outputs = {o.name for o in g.output}

    # ORT's QDQRemovableActivation: Relu / Clip after a quantized op, sole consumer, not an output.
    removed = set()
    quantized_tensors = set()
    for n in list(g.node):
        if n.op_type in QUANTIZED_OPS:
            quantized_tensors.update(n.output)
        if n.op_type in REMOVABLE and n.input[0] in quantized_tensors and len(consumers[n.input[0]]) == 1 and \
                n.input[0] not in graph_outputs and producer.get(n.input[0]) is not None:
            up = producer[n.input[0]]
            up.output[list(up.output).index(n.input[0])] = n.output[0]
            removed.add(id(n))
            quantized_tensors.add(n.output[0])
    kept = [n for n in g.node if id(n) not in removed]
    del g.node[:]
    g.node.extend(kept)

    new_inits = []
    params = {}  # activation -> (scale name, zp name)

    def act_params(t):
        if t not in params:
            if t in inits:
                v = numpy_helper.to_array(inits[t])
                rmin, rmax = v.min(), v.max()
            else:
                rmin, rmax = ranges[t]
            s, z = uint8_params(rmin, rmax)
            params[t] = (t + "_scale", t + "_zero_point")
            new_inits.extend([numpy_helper.from_array(np.array(s, np.float32), params[t][0]),
                              numpy_helper.from_array(np.array(z, np.uint8), params[t][1])])
        return params[t]

    to_quantize = []  # activations, in order
    for n in g.node:
        if n.op_type not in QUANTIZED_OPS:
            continue
        for k in ACTIVATION_INPUTS.get(n.op_type, range(len(n.input))):
            if k < len(n.input) and n.input[k] and n.input[k] not in to_quantize:
                to_quantize.append(n.input[k])
        for o in n.output:
            if n.op_type in SAME_SCALE_AS_INPUT:
                params[o] = act_params(n.input[0])
            if o not in to_quantize:
                to_quantize.append(o)

    # Weights (int8 per channel) and biases (int32) of Conv / ConvTranspose / Gemm.
    dq_nodes = []
    for n in g.node:
        if n.op_type not in ("Conv", "ConvTranspose", "Gemm"):
            continue
        w = numpy_helper.to_array(inits[n.input[1]])
        axis = WEIGHT_AXIS.get(n.op_type, 0 if any(a.name == "transB" and a.i for a in n.attribute) else 1)
        q, ws = quantize_weight(w, axis)
        base = n.input[1]
        wi = len(new_inits)
        new_inits += [numpy_helper.from_array(q, base + "_quantized"), numpy_helper.from_array(ws, base + "_scale"),
                      numpy_helper.from_array(np.zeros_like(ws, np.int8), base + "_zero_point")]
        dq_nodes.append(helper.make_node("DequantizeLinear", [base + "_quantized", base + "_scale", base + "_zero_point"],
                                         [base + "_DequantizeLinear_Output"], name=base + "_DequantizeLinear", axis=axis))
        n.input[1] = base + "_DequantizeLinear_Output"
        if len(n.input) > 2 and n.input[2]:
            b = numpy_helper.to_array(inits[n.input[2]])
            xs, _ = act_params(n.input[0])
            x_scale = numpy_helper.to_array(next(i for i in new_inits if i.name == xs))
            # A channel whose bias would pass int32 at x_scale * w_scale gets a larger weight scale
            # (what ORT's quantizer does since 1.18, _adjust_weight_scale_for_int32_bias).
            need = (np.abs(b).astype(np.float64) / (x_scale * (2.0**31 - 1)) * 1.0001).astype(np.float32)
            if np.any(ws < need):
                ws = np.maximum(ws, need).astype(np.float32)
                shape = [1] * w.ndim
                shape[axis] = -1
                q = np.clip(np.rint(w / ws.reshape(shape)), -127, 127).astype(np.int8)
                new_inits[wi] = numpy_helper.from_array(q, n.input[1][:-len("_DequantizeLinear_Output")] + "_quantized")
                new_inits[wi + 1] = numpy_helper.from_array(ws, n.input[1][:-len("_DequantizeLinear_Output")] + "_scale")
            bs = (x_scale * ws).astype(np.float32)
            bq = np.clip(np.rint(b / bs), -2.0**31, 2.0**31 - 1).astype(np.int32)
            base = n.input[2]
            new_inits += [numpy_helper.from_array(bq, base + "_quantized"), numpy_helper.from_array(bs, base + "_scale"),
                          numpy_helper.from_array(np.zeros_like(bq), base + "_zero_point")]
            dq_nodes.append(helper.make_node("DequantizeLinear",
                                             [base + "_quantized", base + "_scale", base + "_zero_point"],
                                             [base + "_DequantizeLinear_Output"], name=base + "_DequantizeLinear",
                                             axis=0))
            n.input[2] = base + "_DequantizeLinear_Output"

    # A Q -> DQ pair on every quantized activation; consumers read the DQ output. A graph output keeps
    # its name on the DQ (the producer's value is renamed).
    nodes = list(dq_nodes)
    rename = {}
    for t in to_quantize:
        if t in graph_outputs:
            rename[t] = t + "_QuantizeInput"
    for n in g.node:
        for k, i in enumerate(n.input):
            if i in rename:
                n.input[k] = rename[i]
        for k, o in enumerate(n.output):
            if o in rename:
                n.output[k] = rename[o]
    qdq_of = {}
    for t in to_quantize:
        s, z = act_params(t)
        src = rename.get(t, t)
        dq_out = t if t in graph_outputs else t + "_DequantizeLinear_Output"
        qdq_of[src] = dq_out
        nodes.append(helper.make_node("QuantizeLinear", [src, s, z], [t + "_QuantizeLinear_Output"],
                                      name=t + "_QuantizeLinear"))
        nodes.append(helper.make_node("DequantizeLinear", [t + "_QuantizeLinear_Output", s, z], [dq_out],
                                      name=t + "_DequantizeLinear"))
    for n in g.node:
        for k, i in enumerate(n.input):
            if i in qdq_of:
                n.input[k] = qdq_of[i]
    # Topological order: each Q/DQ pair right after its producer (graph inputs and weights first).
    pairs = collections.defaultdict(list)
    for i in range(len(dq_nodes), len(nodes), 2):
        pairs[nodes[i].input[0]] += nodes[i:i + 2]
    ordered = list(dq_nodes)
    for i in g.input:
        ordered += pairs.pop(i.name, [])
    for n in g.node:
        ordered.append(n)
        for o in n.output:
            ordered += pairs.pop(o, [])
    for t in list(pairs):
        ordered += pairs.pop(t)  # initializers quantized as activations (constant operands of Add / Mul)
    ordered = reorder_for_initializer_pairs(ordered, inits)
    del g.node[:]
    g.node.extend(ordered)
    g.initializer.extend(new_inits)
    # drop the float weights and biases now read through DequantizeLinear
    still = {i for n in g.node for i in n.input}
    keep = [i for i in g.initializer if i.name in still]
    del g.initializer[:]
    g.initializer.extend(keep)
    del g.value_info[:]
    return m


def reorder_for_initializer_pairs(nodes, inits):
    """Q of an initializer first, then its DQ: both before any node (they read only constants)."""
    first = [n for n in nodes if n.op_type == "QuantizeLinear" and n.input[0] in inits]
    outs = {n.output[0] for n in first}
    first += [n for n in nodes if n.op_type == "DequantizeLinear" and n.input[0] in outs]
    ids = {id(n) for n in first}
    return first + [n for n in nodes if id(n) not in ids]


def share_weights(qdq, ql, folder, file="weights.bin"):
    """The int8 weights both forms hold (same name, same bytes) go once to external data that both
    graphs reference: the pair costs the test data one copy of the weights."""
    ql_inits = {i.name: i for i in ql.graph.initializer}
    blob = bytearray()
    for i in qdq.graph.initializer:
        other = ql_inits.get(i.name)
        if i.data_type != onnx.TensorProto.INT8 or len(i.raw_data) < 1024 or other is None:
            continue
        if numpy_helper.to_array(other).tobytes() != numpy_helper.to_array(i).tobytes():
            continue
        offset = len(blob)
        blob += numpy_helper.to_array(i).tobytes()
        blob += bytes((-len(blob)) % 64)
        for t in (i, other):
            t.ClearField("raw_data")
            del t.int32_data[:]
            t.data_location = onnx.TensorProto.EXTERNAL
            del t.external_data[:]
            for k, v in (("location", file), ("offset", str(offset)), ("length", str(t.dims and
                                                                                   int(np.prod(t.dims)) or 1))):
                t.external_data.add(key=k, value=v)
    with open(os.path.join(folder, file), "wb") as f:
        f.write(blob)


def main():
    work = tempfile.mkdtemp(prefix="qlinear-")
    for case, (model, shape, make, calib) in CASES.items():
        out = os.path.join(DATA, case + "_qlinear")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        prepared = os.path.join(work, case + ".prepared.onnx")
        m = prepare(os.path.join(MODELS, model), shape, prepared)
        ranges = collect_ranges(m, work, case, [make(lines) for lines in calib])
        qdq = make_qdq(m, ranges)
        onnx.checker.check_model(qdq)
        qdq_path = os.path.join(out, "qdq.onnx")
        onnx.save(qdq, qdq_path)
        qlinear_path = os.path.join(out, "qlinear.onnx")
        node_js("optimize", qdq_path, qlinear_path, "extended")
        ql = onnx.load(qlinear_path)
        # ORT lists every domain it knows; keep the ones the graph uses.
        used = {n.domain for n in ql.graph.node}
        keep = [o for o in ql.opset_import if o.domain in used or o.domain in ("", "ai.onnx")]
        del ql.opset_import[:]
        ql.opset_import.extend(keep)
        share_weights(qdq, ql, out)
        onnx.save(qdq, qdq_path)
        onnx.save(ql, qlinear_path)
        inputs = os.path.join(DATA, case, "inputs")
        subprocess.run(["node", RUN, qlinear_path, inputs, os.path.join(out, "ort_outputs")], check=True)
        subprocess.run(["node", RUN, qdq_path, inputs, os.path.join(out, "ort_qdq_outputs")], check=True)
        ops = collections.Counter((n.domain or "ai.onnx") + ":" + n.op_type for n in ql.graph.node)
        print(f"{case}: qdq.onnx {os.path.getsize(qdq_path)} bytes, qlinear.onnx {os.path.getsize(qlinear_path)} "
              f"bytes; {dict(sorted(ops.items()))}")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
