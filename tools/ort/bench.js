#!/usr/bin/env node
// Times ONNX Runtime (CPU, all graph optimizations, N intra-op threads) on one model: the peer of
// bench/bench_executor. Prints JSON with the median of the repetitions and the
// process CPU time per repetition (all threads; robust to other load on a shared machine).
// Usage: node tools/ort/bench.js MODEL.onnx INPUT_DIR [repetitions=20] [threads=2]
'use strict';

const path = require('path');
const ort = require('onnxruntime-node');
const { readNpy, safeName } = require('./run_reference.js');

async function main() {
  const [modelPath, inputDir, repsArg, threadsArg] = process.argv.slice(2);
  if (!inputDir) {
    console.error('usage: node bench.js MODEL.onnx INPUT_DIR [repetitions] [threads]');
    process.exit(2);
  }
  const reps = Number(repsArg || 20), threads = Number(threadsArg || 2);
  const session = await ort.InferenceSession.create(modelPath, {
    executionProviders: ['cpu'],
    graphOptimizationLevel: 'all',
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
  });
  const feeds = {};
  for (const name of session.inputNames) feeds[name] = readNpy(path.join(inputDir, safeName(name) + '.npy'));
  await session.run(feeds);  // warm-up
  const ms = [];
  const cpu0 = process.cpuUsage();
  for (let r = 0; r < reps; ++r) {
    const t0 = process.hrtime.bigint();
    await session.run(feeds);
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  const cpu = process.cpuUsage(cpu0);
  ms.sort((a, b) => a - b);
  console.log(JSON.stringify({ peer: `onnxruntime-node ${require('onnxruntime-node/package.json').version}`,
                               model: modelPath, median_ms: ms[Math.floor(ms.length / 2)], min_ms: ms[0],
                               cpu_ms: (cpu.user + cpu.system) / 1e3 / reps, repetitions: reps, threads }));
}

main().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
