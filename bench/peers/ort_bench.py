#!/usr/bin/python3
"""ONNX Runtime (CPU, all graph optimizations) timed on one model: the Python twin of
tools/ort/bench.js, for machines with the onnxruntime wheel but no Node.js (the lent GPU machine).
Prints the same JSON: median wall ms of the repetitions and process CPU ms per repetition.
Usage: ort_bench.py MODEL.onnx INPUT_DIR [repetitions=20] [threads=2]"""
import json
import os
import re
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    model, inputs = sys.argv[1], sys.argv[2]
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    so = ort.SessionOptions()
    so.log_severity_level = 3  # errors only (not the unused-initializer warnings)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.load(os.path.join(inputs, re.sub(r"[^A-Za-z0-9_.-]", "_", i.name) + ".npy"))
             for i in session.get_inputs()}
    session.run(None, feeds)  # warm-up
    ms = []
    cpu0 = time.process_time()
    for _ in range(reps):
        t0 = time.perf_counter()
        session.run(None, feeds)
        ms.append((time.perf_counter() - t0) * 1e3)
    cpu = (time.process_time() - cpu0) * 1e3 / reps
    print(json.dumps({"model": model, "median_ms": statistics.median(ms), "min_ms": min(ms), "cpu_ms": cpu,
                      "repetitions": reps, "threads": threads, "peer": "onnxruntime " + ort.__version__}))


if __name__ == "__main__":
    main()
