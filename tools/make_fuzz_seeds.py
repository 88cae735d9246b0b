#!/usr/bin/python3
"""Writes small ONNX seeds for fuzz_onnx_loader (tests/fuzz/corpus/onnx_loader/gen_*.onnx): the
graph shapes the executor fuses or folds (attention, elementwise chains, Conv + BatchNormalization
for the fp16 deployment fold, shape arithmetic feeding Reshape), with symbolic dims, which the
ONNX node tests do not reach. Deterministic; rerun after changing it."""
import os
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fuzz", "corpus", "onnx_loader")
rng = np.random.default_rng(21)


def const(name, shape, dtype=np.float32):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(dtype), name)


def save(name, nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="make_fuzz_seeds")
    m.ir_version = 8
    # (no onnx.checker: 1.12 wants a shape on every output; qeval reads outputs without one)
    with open(os.path.join(OUT, "gen_" + name + ".onnx"), "wb") as f:
        f.write(m.SerializeToString())


f32 = TensorProto.FLOAT
# Attention: MatMul(q, k^T) -> Mul(scale) -> Softmax(-1) -> MatMul(v), batch and tokens symbolic.
save("attention",
     [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
      helper.make_node("MatMul", ["x", "wv"], ["v"]),
      helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
      helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"]),
      helper.make_node("Softmax", ["ss"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])],
     [helper.make_tensor_value_info("x", f32, ["b", "t", 8])], [helper.make_tensor_value_info("y", f32, None)],
     [const("wq", (8, 8)), const("wk", (8, 8)), const("wv", (8, 8)),
      numpy_helper.from_array(np.array(0.35, np.float32), "scale")])
# Elementwise chain (fused into one pass): Add -> Mul -> Sigmoid -> Mul -> Tanh -> Div.
save("elementwise_chain",
     [helper.make_node("Add", ["x", "a"], ["t1"]), helper.make_node("Mul", ["t1", "m"], ["t2"]),
      helper.make_node("Sigmoid", ["t2"], ["t3"]), helper.make_node("Mul", ["t3", "t2"], ["t4"]),
      helper.make_node("Tanh", ["t4"], ["t5"]), helper.make_node("Div", ["t5", "d"], ["y"])],
     [helper.make_tensor_value_info("x", f32, ["n", 4])], [helper.make_tensor_value_info("y", f32, None)],
     [const("a", (4,)), const("m", (1, 4)), numpy_helper.from_array(np.array([2.0], np.float32), "d")])
# Conv -> BatchNormalization -> Relu (the fp16 deployment fold) -> GlobalAveragePool -> Flatten -> Gemm.
save("conv_bn_gemm",
     [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
      helper.make_node("BatchNormalization", ["c", "g", "be", "mu", "var"], ["bn"], epsilon=1e-5),
      helper.make_node("Relu", ["bn"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["p"]),
      helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("Gemm", ["f", "gw", "gb"], ["y"], transB=1)],
     [helper.make_tensor_value_info("x", f32, ["n", 3, "h", "w"])], [helper.make_tensor_value_info("y", f32, None)],
     [const("w", (4, 3, 3, 3)), const("b", (4,)), const("g", (4,)), const("be", (4,)), const("mu", (4,)),
      numpy_helper.from_array(np.abs(rng.standard_normal(4)).astype(np.float32) + 0.5, "var"),
      const("gw", (5, 4)), const("gb", (5,))])
# Shape arithmetic: Shape -> Gather -> Concat -> Reshape, Expand, Slice with computed ends, Cast.
i64 = np.int64
save("shape_arithmetic",
     [helper.make_node("Shape", ["x"], ["s"]),
      helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
      helper.make_node("Concat", ["n", "minus1"], ["target"], axis=0),
      helper.make_node("Reshape", ["x", "target"], ["r"]),
      helper.make_node("Expand", ["r", "eshape"], ["e"]),
      helper.make_node("Slice", ["e", "starts", "n", "zero"], ["sl"]),
      helper.make_node("Cast", ["sl"], ["y"], to=TensorProto.FLOAT16)],
     [helper.make_tensor_value_info("x", f32, ["n", 2, "k"])],
     [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
     [numpy_helper.from_array(np.array([0], i64), "zero"), numpy_helper.from_array(np.array([-1], i64), "minus1"),
      numpy_helper.from_array(np.array([3, 1, 1], i64), "eshape"), numpy_helper.from_array(np.array([0], i64), "starts")])
# Integer Div/Mod and Where on int64 graph inputs (planned as constants when small).
save("integer_ops",
     [helper.make_node("Div", ["a", "b"], ["q"]), helper.make_node("Mod", ["a", "b"], ["r"], fmod=0),
      helper.make_node("Greater", ["q", "r"], ["c"]), helper.make_node("Where", ["c", "q", "r"], ["y"])],
     [helper.make_tensor_value_info("a", TensorProto.INT64, [4]), helper.make_tensor_value_info("b", TensorProto.INT64, [4])],
     [helper.make_tensor_value_info("y", TensorProto.INT64, None)], [])
print("wrote", OUT)
