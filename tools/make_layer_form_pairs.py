#!/usr/bin/python3
"""Writes pairs of exports of one small network in the forms exporters give a layer, for the
layer-matching tests (tests/eval/run/layer_forms_test.cc): tests/data/layer_forms/.

- block_opset16.onnx / block_opset17.onnx: a tiny pre-norm transformer block (LayerNorm, attention,
  MLP with GELU, a 2-D classifier head) exported by torch.onnx at opset 16 (LayerNormalization
  decomposed into ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add) and 17 (one op).
  Linear layers on 3-D inputs are MatMul + Add, the head on a 2-D input is a Gemm (transB).
- block_opset17_matmul.onnx: the opset-17 export with every Gemm rewritten as MatMul by the
  transposed constant (a Transpose node, as unfolded exports keep it) + Add, node and tensor names
  of another exporter ("/export2/...").
- inputs/x.npy: one input; outputs/<name>.npy: ONNX Runtime is not needed: torch's output.
Seeded; rerun after changing the network.
"""
import os

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "layer_forms")


class Block(torch.nn.Module):
    def __init__(self, d=16, heads=2, classes=5):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 2 * d)
        self.fc2 = torch.nn.Linear(2 * d, d)
        self.head = torch.nn.Linear(d, classes)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        x = x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))
        return self.head(x.mean(dim=1))


def gemm_to_matmul(model):
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    nodes = []
    for k, n in enumerate(g.node):
        if n.op_type != "Gemm":
            nodes.append(n)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        assert attrs.get("transA", 0) == 0 and attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0
        w = n.input[1]
        if attrs.get("transB", 0):
            nodes.append(helper.make_node("Transpose", [w], [f"/export2/t{k}"], name=f"/export2/Transpose_{k}", perm=[1, 0]))
            w = f"/export2/t{k}"
        nodes.append(helper.make_node("MatMul", [n.input[0], w], [f"/export2/mm{k}"], name=f"/export2/MatMul_{k}"))
        nodes.append(helper.make_node("Add", [f"/export2/mm{k}", n.input[2]], list(n.output), name=f"/export2/Add_{k}"))
    del g.node[:]
    g.node.extend(nodes)
    # Another exporter's names: every node and intermediate tensor renamed.
    outputs = {o.name for o in g.output}
    rename = {}
    for k, n in enumerate(g.node):
        n.name = f"/export2/{k}_{n.op_type}"
        for i, o in enumerate(n.output):
            if o not in outputs:
                rename[o] = f"/export2/v{len(rename)}"
                n.output[i] = rename[o]
    for n in g.node:
        for i, v in enumerate(n.input):
            n.input[i] = rename.get(v, v)
    del inits
    return model


def main():
    torch.manual_seed(20)
    m = Block().eval()
    x = torch.randn(1, 6, 16)
    os.makedirs(os.path.join(OUT, "inputs"), exist_ok=True)
    os.makedirs(os.path.join(OUT, "outputs"), exist_ok=True)
    for opset in (16, 17):
        path = os.path.join(OUT, f"block_opset{opset}.onnx")
        torch.onnx.export(m, (x,), path, opset_version=opset, input_names=["x"], output_names=["logits"])
    model = gemm_to_matmul(onnx.load(os.path.join(OUT, "block_opset17.onnx")))
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(OUT, "block_opset17_matmul.onnx"))
    np.save(os.path.join(OUT, "inputs", "x.npy"), x.numpy())
    with torch.no_grad():
        np.save(os.path.join(OUT, "outputs", "logits.npy"), m(x).numpy())
    for f in sorted(os.listdir(OUT)):
        if f.endswith(".onnx"):
            g = onnx.load(os.path.join(OUT, f)).graph
            ops = {}
            for n in g.node:
                ops[n.op_type] = ops.get(n.op_type, 0) + 1
            print(f, os.path.getsize(os.path.join(OUT, f)), dict(sorted(ops.items())))


if __name__ == "__main__":
    main()
