#!/usr/bin/python3
"""Inputs of the ONNX Runtime calibration peer (tools/ort/calibrate_txt2img.js): the tiny-sd UNet
augmented with every tensor a qeval calibration observed as an extra graph output (what ONNX
Runtime's own calibrators do: onnxruntime/quantization/calibrate.py augment_graph), the prompts'
token ids and the seeded initial noise, as `qeval calibrate --pipeline` runs them.

Usage: bench/peers/calibration_inputs.py PIPELINE_DIR PROMPTS COUNT SCALES_JSON OUT_DIR
  SCALES_JSON: the scales.json of `qeval calibrate` (which node inputs were observed, which
  SmoothQuant layers needed per-channel ranges). Writes OUT_DIR/unet_augmented.onnx,
  targets.json, input_ids.npy [COUNT, 2, 77] (["", prompt]) and noise.npy [COUNT, 1, C, h, w]
  (seed i for prompt i).
"""

import json
import os
import sys

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import tiny_sd_pipeline as P  # noqa: E402
import train_tokenizer as T  # noqa: E402


def read_prompts(path, count):
    # eval/pipelines/prompt_set.h: one a line, '#' comments and blank lines skipped
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out[:count]


def main():
    if len(sys.argv) != 6:
        raise SystemExit(__doc__)
    pipeline_dir, prompts_path, count, scales_path, out = sys.argv[1:]
    os.makedirs(out, exist_ok=True)
    cfg = json.load(open(os.path.join(pipeline_dir, "pipeline.json")))
    scales = json.load(open(scales_path))

    model = onnx.load(os.path.join(pipeline_dir, cfg["unet"]["model"]))
    nodes = {n.name: n for n in model.graph.node}
    graph_inputs = {i.name for i in model.graph.input}
    smoothed = {s["node"] for s in scales.get("smoothquant", [])}
    targets = {}
    for a in scales["activations"]:
        tensor = nodes[a["node"]].input[a["input"]]
        t = targets.setdefault(tensor, {"tensor": tensor, "graph_input": tensor in graph_inputs, "per_channel": False,
                                        "nodes": []})
        t["nodes"].append([a["node"], a["input"]])
        t["per_channel"] |= a["node"] in smoothed and a["role"] == "input"
    existing = {o.name for o in model.graph.output}
    for t in targets.values():
        if not t["graph_input"] and t["tensor"] not in existing:
            model.graph.output.append(onnx.helper.make_tensor_value_info(t["tensor"], onnx.TensorProto.FLOAT, None))
    onnx.save(model, os.path.join(out, "unet_augmented.onnx"))
    with open(os.path.join(out, "targets.json"), "w") as f:
        json.dump({"targets": list(targets.values()), "observed_inputs": len(scales["activations"])}, f, indent=1)

    tok = T.ClipTokenizer.load(os.path.join(pipeline_dir, "tokenizer"))
    prompts = read_prompts(prompts_path, int(count))
    negative = cfg["defaults"].get("negative_prompt", "")
    ids = np.array([[tok.encode(negative), tok.encode(p)] for p in prompts], dtype=np.int32)
    lat = cfg["latent"]
    noise = np.stack([P.seeded_noise(i, (1, lat["channels"], lat["height"], lat["width"])) for i in range(len(prompts))])
    np.save(os.path.join(out, "input_ids.npy"), ids)
    np.save(os.path.join(out, "noise.npy"), noise)
    print("%d prompts, %d observed node inputs on %d distinct tensors (%d per channel)" % (
        len(prompts), len(scales["activations"]), len(targets), sum(t["per_channel"] for t in targets.values())))


if __name__ == "__main__":
    main()
