#!/usr/bin/env node
// ONNX Runtime's side of tools/make_ort_qlinear_models.py (ORT's own graph optimizer and range
// collection; no quantizer, which is Python-only and not packaged for Debian).
//
//   node qdq_to_qlinear.js optimize SRC.onnx DST.onnx LEVEL
//       saves the graph as ORT's optimizer leaves it at LEVEL (basic | extended), CPU EP: at
//       'extended' an ORT-convention Q/DQ graph becomes ORT's QOperator (QLinear*) form.
//   node qdq_to_qlinear.js ranges MODEL.onnx OUT.json INPUT_DIR...
//       runs MODEL (every value of interest made a graph output by the caller) on each INPUT_DIR's
//       .npy inputs, optimizations off, one thread, and writes {output: [min, max]} over all runs
//       (ONNX Runtime's MinMax calibrator: plain min and max, no averaging).
'use strict';

const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');
const { readNpy, safeName } = require('./run_reference.js');

async function optimize(src, dst, level) {
  await ort.InferenceSession.create(src, {
    executionProviders: ['cpu'],
    graphOptimizationLevel: level,
    optimizedModelFilePath: dst,
    intraOpNumThreads: 1,
  });
  console.log(`${dst}: written by ONNX Runtime ${ort.env.versions.common} at level '${level}'`);
}

async function ranges(model, out, inputDirs) {
  const session = await ort.InferenceSession.create(model, {
    executionProviders: ['cpu'],
    graphOptimizationLevel: 'disabled',
    intraOpNumThreads: 1,
    interOpNumThreads: 1,
    executionMode: 'sequential',
  });
  const r = {};
  for (const dir of inputDirs) {
    const feeds = {};
    for (const name of session.inputNames) feeds[name] = readNpy(path.join(dir, safeName(name) + '.npy'));
    const results = await session.run(feeds);
    for (const name of session.outputNames) {
      const t = results[name];
      if (t.type !== 'float32') continue;
      let lo = Infinity, hi = -Infinity;
      for (const v of t.data) {
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
      if (!(name in r)) r[name] = [lo, hi];
      else r[name] = [Math.min(r[name][0], lo), Math.max(r[name][1], hi)];
    }
  }
  fs.writeFileSync(out, JSON.stringify(r, null, 1));
  console.log(`${out}: ranges of ${Object.keys(r).length} values over ${inputDirs.length} inputs`);
}

async function main() {
  const [verb, ...args] = process.argv.slice(2);
  if (verb === 'optimize' && args.length === 3) return optimize(...args);
  if (verb === 'ranges' && args.length >= 3) return ranges(args[0], args[1], args.slice(2));
  console.error('usage: node qdq_to_qlinear.js optimize SRC DST LEVEL | ranges MODEL OUT.json INPUT_DIR...');
  process.exit(2);
}

main().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
