#!/usr/bin/python3
"""Old-opset forms the opset upgrade rewrites (eval/exec/opset_upgrade.h), written at their own opsets
with ONNX Runtime's outputs of the originals: tests/data/opset_upgrade/<case>/. The test
OpsetUpgrade.MatchesOnnxRuntimeOnTheOriginalForms upgrades each model to 13 and 19 and compares
qeval's outputs of the upgraded graph with these."""

# Usage (from the repository root):
#   (cd tools/ort && npm ci --ignore-scripts)      # once
#   /usr/bin/python3 tools/make_opset_upgrade_references.py
# QEVAL_ORT_DIR=<folder holding run_reference.js and its node_modules> uses another checkout's.
#
# Writes, per case: model.onnx, inputs/x.npy, outputs/<name>.npy (ONNX Runtime, CPU EP, no graph
# optimization, the model at its own opset).

import os
import shutil
import subprocess

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_ROOT = os.path.join(REPO, "tests", "data", "opset_upgrade")
ORT_RUNNER = os.path.join(os.environ.get("QEVAL_ORT_DIR", os.path.join(REPO, "tools", "ort")), "run_reference.js")
FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def model(opset, x_shape, nodes, outputs, initializers=()):
    graph = helper.make_graph(nodes, "old", [helper.make_tensor_value_info("x", FLOAT, x_shape)],
                              [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in initializers])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    return m


def f32(*v):
    return np.array(v, np.float32)


def cases():
    out = {}
    for mode in ("nearest", "linear"):
        out["upsample7_" + mode] = model(7, [1, 2, 3, 4], [helper.make_node(
            "Upsample", ["x"], ["y"], mode=mode, scales=[1.0, 1.0, 2.0, 2.5])], [("y", FLOAT)])
        out["upsample9_" + mode] = model(9, [1, 1, 3, 5], [helper.make_node(
            "Upsample", ["x", "scales"], ["y"], mode=mode)], [("y", FLOAT)], [("scales", f32(1, 1, 3, 1.5))])
        out["resize10_shrink_" + mode] = model(10, [1, 2, 5, 7], [helper.make_node(
            "Resize", ["x", "scales"], ["y"], mode=mode)], [("y", FLOAT)], [("scales", f32(1, 1, 0.6, 0.45))])
        out["resize10_enlarge_" + mode] = model(10, [1, 2, 3, 4], [helper.make_node(
            "Resize", ["x", "scales"], ["y"], mode=mode)], [("y", FLOAT)], [("scales", f32(1, 1, 1.7, 2.25))])
    for nearest in ("floor", "round_prefer_floor"):
        for tag, s in (("shrink", 0.6), ("enlarge", 1.7)):
            out["resize11_tf_half_pixel_for_nn_%s_%s" % (nearest, tag)] = model(11, [1, 1, 5, 6], [helper.make_node(
                "Resize", ["x", "roi", "scales"], ["y"], coordinate_transformation_mode="tf_half_pixel_for_nn",
                nearest_mode=nearest)], [("y", FLOAT)], [("roi", np.zeros([0], np.float32)), ("scales", f32(1, 1, s, s))])
    for op in ("Softmax", "LogSoftmax"):
        for axis in (0, 1, 2, -1):
            out["%s11_axis%d" % (op.lower(), axis)] = model(11, [2, 3, 4], [helper.make_node(
                op, ["x"], ["y"], axis=axis)], [("y", FLOAT)])
        out["%s9_default_axis_rank3" % op.lower()] = model(9, [2, 3, 4], [helper.make_node(op, ["x"], ["y"])],
                                                           [("y", FLOAT)])
    for mode in ("constant", "reflect", "edge"):
        out["pad2_" + mode] = model(9, [1, 2, 3, 4], [helper.make_node(
            "Pad", ["x"], ["y"], mode=mode, pads=[0, 0, 1, 2, 0, 0, 2, 1], value=1.25)], [("y", FLOAT)])
    out["clip6_bounds"] = model(9, [2, 5], [
        helper.make_node("Clip", ["x"], ["a"], min=-1.0, max=1.5),
        helper.make_node("Clip", ["x"], ["b"], max=0.5),
        helper.make_node("Clip", ["x"], ["c"], min=-0.25)], [("a", FLOAT), ("b", FLOAT), ("c", FLOAT)])
    out["attributes_to_inputs9"] = model(9, [2, 3, 8], [
        helper.make_node("Slice", ["x"], ["s"], starts=[1, -6], ends=[1000, -1], axes=[0, 2]),
        helper.make_node("Squeeze", ["s"], ["q"], axes=[0]),
        helper.make_node("Unsqueeze", ["q"], ["u"], axes=[0, 3]),
        helper.make_node("ReduceSum", ["u"], ["r"], axes=[2], keepdims=0),
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
        helper.make_node("TopK", ["x"], ["tv", "ti"], k=3, axis=2),
        helper.make_node("Split", ["x"], ["p0", "p1"], axis=2, split=[3, 5]),
        helper.make_node("Split", ["x"], ["e0", "e1"], axis=2),
        helper.make_node("Dropout", ["x"], ["d"], ratio=0.3)],
        [("r", FLOAT), ("m", FLOAT), ("tv", FLOAT), ("ti", INT64), ("p0", FLOAT), ("p1", FLOAT), ("e0", FLOAT),
         ("e1", FLOAT), ("d", FLOAT)])
    rng = np.random.RandomState(7)
    for spatial, shape in ((1, [3]), (0, [3, 4])):
        stats = [("scale", rng.uniform(-2, 2, shape).astype(np.float32)),
                 ("bias", rng.uniform(-1, 1, shape).astype(np.float32)),
                 ("mean", rng.uniform(-1, 1, shape).astype(np.float32)),
                 ("var", rng.uniform(0.1, 3, shape).astype(np.float32))]
        out["batchnorm7_spatial%d" % spatial] = model(7, [2, 3, 4], [helper.make_node(
            "BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"], spatial=spatial, epsilon=1e-2)],
            [("y", FLOAT)], stats)
    return out


def main():
    if os.path.isdir(OUT_ROOT):
        shutil.rmtree(OUT_ROOT)
    rng = np.random.RandomState(20261126)
    for name, m in cases().items():
        d = os.path.join(OUT_ROOT, name)
        os.makedirs(os.path.join(d, "inputs"))
        onnx.save(m, os.path.join(d, "model.onnx"))
        shape = [dim.dim_value for dim in m.graph.input[0].type.tensor_type.shape.dim]
        np.save(os.path.join(d, "inputs", "x.npy"), rng.uniform(-3, 3, shape).astype(np.float32))
        subprocess.run(["node", ORT_RUNNER, os.path.join(d, "model.onnx"), os.path.join(d, "inputs"),
                        os.path.join(d, "outputs")], check=True, stdout=subprocess.DEVNULL)
        print(name, "ok")


if __name__ == "__main__":
    main()
