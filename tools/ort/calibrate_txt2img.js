#!/usr/bin/env node
// The calibration peer of `qeval calibrate --pipeline models/tiny-sd`: the same prompts, seeds and
// DDIM loop with classifier-free guidance (tools/ort/txt2img.js) on ONNX Runtime, the UNet
// augmented with every observed tensor as an extra output (ONNX Runtime's own calibrators do this;
// graph optimizations off, as they run it), and per UNet call the statistics qeval's RangeCollector
// keeps for a percentile recipe with SmoothQuant: max |x| per tensor filed under the step (max and
// mean over calls), and the per-channel (last axis) max |x| of the SmoothQuant layers' inputs.
// Inputs from bench/peers/calibration_inputs.py. Prints timings as JSON; writes WORK_DIR/ort_ranges.json.
// Usage: node tools/ort/calibrate_txt2img.js PIPELINE_DIR WORK_DIR [threads=2] [steps] [optimization=disabled]
'use strict';

const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');
const { readNpy } = require('./run_reference.js');
const { ddim, denoise, decode } = require('./txt2img.js');

async function main() {
  const [pipelineDir, work, threadsArg, stepsArg, optArg] = process.argv.slice(2);
  if (!work) {
    console.error('usage: node calibrate_txt2img.js PIPELINE_DIR WORK_DIR [threads] [steps] [optimization]');
    process.exit(2);
  }
  const cfg = JSON.parse(fs.readFileSync(path.join(pipelineDir, 'pipeline.json'), 'utf8'));
  const threads = Number(threadsArg || 2), steps = Number(stepsArg || cfg.defaults.steps);
  const t0 = process.hrtime.bigint(), c0 = process.cpuUsage();
  const options = { executionProviders: ['cpu'], graphOptimizationLevel: optArg || 'disabled',
                    intraOpNumThreads: threads, interOpNumThreads: 1, executionMode: 'sequential',
                    // No spinning worker threads: on a shared machine they burn CPU time waiting.
                    extra: { session: { intra_op: { allow_spinning: '0' } } } };
  const text = await ort.InferenceSession.create(path.join(pipelineDir, cfg.text_encoder.model), options);
  const unet = await ort.InferenceSession.create(path.join(work, 'unet_augmented.onnx'), options);
  const vae = await ort.InferenceSession.create(path.join(pipelineDir, cfg.vae_decoder.model), options);
  const targets = JSON.parse(fs.readFileSync(path.join(work, 'targets.json'), 'utf8')).targets;
  const ids = readNpy(path.join(work, 'input_ids.npy')), noise = readNpy(path.join(work, 'noise.npy'));
  const prompts = ids.dims[0], idLen = ids.dims[2], dims = noise.dims.slice(1);
  const n = dims.reduce((a, b) => a * b, 1);
  const sched = ddim(cfg.scheduler, steps);
  const stats = targets.map(() => ({ stepMax: new Array(steps).fill(0), stepSum: new Array(steps).fill(0),
                                     stepCalls: new Array(steps).fill(0), channel: null }));
  const fetches = [cfg.unet.output, ...targets.filter((t) => !t.graph_input).map((t) => t.tensor)];
  const loaded = process.hrtime.bigint();
  let unetWall = 0, collectWall = 0;  // inside the loop: UNet runs, and the statistics in JS

  function collect(s, step, data, lastDim, perChannel) {
    let m = 0;
    for (let i = 0; i < data.length; ++i) {
      const a = Math.abs(data[i]);
      if (a > m && a !== Infinity) m = a;  // NaN compares false
    }
    s.stepMax[step] = Math.max(s.stepMax[step], m);
    s.stepSum[step] += m;
    s.stepCalls[step] += 1;
    if (perChannel) {
      if (!s.channel) s.channel = new Float32Array(lastDim);
      for (let i = 0; i < data.length; ++i) {
        const a = Math.abs(data[i]), c = i % lastDim;
        if (a > s.channel[c] && a !== Infinity) s.channel[c] = a;
      }
    }
  }

  for (let p = 0; p < prompts; ++p) {
    const idData = Int32Array.from(ids.data.subarray(p * 2 * idLen, (p + 1) * 2 * idLen));
    const hidden = (await text.run({ [cfg.text_encoder.input]: new ort.Tensor('int32', idData, [2, idLen]) }))[
      cfg.text_encoder.output];
    const x = await denoise(cfg, sched, hidden, noise.data.subarray(p * n, (p + 1) * n), dims, async (feeds, step) => {
      const r0 = process.hrtime.bigint();
      const out = await unet.run(feeds, fetches);
      const r1 = process.hrtime.bigint();
      targets.forEach((tg, k) => {
        const v = tg.graph_input ? feeds[tg.tensor] : out[tg.tensor];
        collect(stats[k], step, v.data, v.dims[v.dims.length - 1], tg.per_channel);
      });
      unetWall += Number(r1 - r0) / 1e9;
      collectWall += Number(process.hrtime.bigint() - r1) / 1e9;
      return out;
    });
    await decode(cfg, vae, x, dims);
  }
  const wall = Number(process.hrtime.bigint() - t0) / 1e9, loop = Number(process.hrtime.bigint() - loaded) / 1e9;
  const c = process.cpuUsage(c0);
  const ranges = {};
  targets.forEach((tg, k) => {
    const s = stats[k];
    ranges[tg.tensor] = { step_max: s.stepMax, step_mean: s.stepSum.map((v, i) => v / Math.max(1, s.stepCalls[i])),
                          channel_amax: s.channel ? Array.from(s.channel) : null };
  });
  fs.writeFileSync(path.join(work, 'ort_ranges.json'), JSON.stringify(ranges));
  console.log(JSON.stringify({ peer: `onnxruntime-node ${require('onnxruntime-node/package.json').version}`,
                               optimization: options.graphOptimizationLevel, prompts, steps, threads,
                               unet_calls: prompts * steps, tensors: targets.length, wall_s: wall, loop_wall_s: loop,
                               unet_run_wall_s: unetWall, collect_wall_s: collectWall,
                               cpu_s: (c.user + c.system) / 1e6 }));
}

main().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
