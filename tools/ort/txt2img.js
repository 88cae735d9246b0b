#!/usr/bin/env node
// The txt2img loop of eval/pipelines/txt2img.cc with ONNX Runtime (CPU) running the same three
// graphs: text encoder on [negative, prompt] ids, DDIM ("leading", eta 0) UNet loop with
// classifier-free guidance (batch 2), VAE decoder. The peer of bench/bench_txt2img: it reads the
// ids and noise that bench_txt2img wrote, times whole images (wall and process CPU), and writes
// its final latent and image [3, H, W] on [0, 1] next to them for a check.
// Usage: node tools/ort/txt2img.js PIPELINE_DIR WORK_DIR [repetitions=5] [threads=2] [steps]
'use strict';

const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');
const { readNpy, writeNpy } = require('./run_reference.js');

// diffusers' DDIMScheduler tables in float64 (docs/pipelines.md), "leading" spacing.
function ddim(s, steps) {
  if (s.type !== 'ddim' || (s.timestep_spacing || 'leading') !== 'leading') throw new Error('only ddim/leading here');
  const T = s.num_train_timesteps, lo = Math.pow(s.beta_start, 0.5), hi = Math.pow(s.beta_end, 0.5);
  const ac = [];
  let prod = 1;
  for (let i = 0; i < T; ++i) {
    const b = i === T - 1 ? hi : i * ((hi - lo) / (T - 1)) + lo;
    prod *= 1 - b * b;
    ac.push(prod);
  }
  const ratio = Math.floor(T / steps), out = [];
  for (let i = steps - 1; i >= 0; --i) {
    const t = i * ratio + (s.steps_offset || 0);
    const prev = t - ratio;
    out.push({ t, a: ac[t], aPrev: prev >= 0 ? ac[prev] : (s.set_alpha_to_one ? 1 : ac[0]) });
  }
  return out;
}

function idsTensor(npy, type) {
  const data = type === 'int64' ? npy.data : Int32Array.from(npy.data, (v) => Number(v));
  return new ort.Tensor(type, data, npy.dims);
}

// The guided DDIM loop from `noise` (one latent, dims [1, C, h, w]) on the text encoder's
// `hidden` states: `runUnet(feeds, step)` returns the UNet's outputs (the caller may fetch more and
// look at them). Returns the final latent.
async function denoise(cfg, sched, hidden, noise, dims, runUnet) {
  const n = noise.length, g = cfg.defaults.guidance_scale;
  let x = Float32Array.from(noise);
  const sample = new Float32Array(2 * n);
  for (let step = 0; step < sched.length; ++step) {
    const { t, a, aPrev } = sched[step];
    sample.set(x, 0);
    sample.set(x, n);
    const feeds = {
      [cfg.unet.sample]: new ort.Tensor('float32', sample, [2, ...dims.slice(1)]),
      [cfg.unet.timestep]: new ort.Tensor('float32', Float32Array.from([t, t]), [2]),
      [cfg.unet.encoder_hidden_states]: hidden,
    };
    const e = (await runUnet(feeds, step))[cfg.unet.output].data;
    const sa = Math.fround(Math.sqrt(a)), sb = Math.fround(Math.sqrt(1 - a));
    const sap = Math.fround(Math.sqrt(aPrev)), sbp = Math.fround(Math.sqrt(1 - aPrev));
    const next = new Float32Array(n);
    for (let k = 0; k < n; ++k) {
      const eps = Math.fround(e[k] + Math.fround(g * Math.fround(e[n + k] - e[k])));
      const x0 = Math.fround(Math.fround(x[k] - Math.fround(sb * eps)) / sa);
      next[k] = Math.fround(sap * x0) + Math.fround(sbp * eps);
    }
    x = next;
  }
  return x;
}

// The VAE decoder's output tensor for a final latent.
async function decode(cfg, vae, x, dims) {
  const scale = Math.fround(cfg.vae_decoder.scaling_factor);
  const z = Float32Array.from(x, (v) => v / scale);
  return (await vae.run({ [cfg.vae_decoder.input]: new ort.Tensor('float32', z, dims) }))[cfg.vae_decoder.output];
}

async function main() {
  const [pipelineDir, work, repsArg, threadsArg, stepsArg] = process.argv.slice(2);
  if (!work) {
    console.error('usage: node txt2img.js PIPELINE_DIR WORK_DIR [repetitions] [threads] [steps]');
    process.exit(2);
  }
  const cfg = JSON.parse(fs.readFileSync(path.join(pipelineDir, 'pipeline.json'), 'utf8'));
  const reps = Number(repsArg || 5), threads = Number(threadsArg || 2);
  const steps = Number(stepsArg || cfg.defaults.steps), g = cfg.defaults.guidance_scale;
  const options = { executionProviders: ['cpu'], graphOptimizationLevel: 'all', intraOpNumThreads: threads,
                    interOpNumThreads: 1, executionMode: 'sequential' };
  const load = (m) => ort.InferenceSession.create(path.join(pipelineDir, cfg[m].model), options);
  const [text, unet, vae] = await Promise.all([load('text_encoder'), load('unet'), load('vae_decoder')]);
  const ids = idsTensor(readNpy(path.join(work, 'input_ids.npy')), cfg.text_encoder.input_type || 'int32');
  const noise = readNpy(path.join(work, 'noise.npy'));
  const sched = ddim(cfg.scheduler, steps);
  const dims = noise.dims;

  async function generate() {
    const hidden = (await text.run({ [cfg.text_encoder.input]: ids }))[cfg.text_encoder.output];
    const x = await denoise(cfg, sched, hidden, noise.data, dims, (feeds) => unet.run(feeds));
    const img = await decode(cfg, vae, x, dims);
    const image = Float32Array.from(img.data, (v) => Math.min(1, Math.max(0, Math.fround(v * 0.5) + 0.5)));
    return { latent: x, image, imageDims: img.dims.slice(1) };
  }

  let r = await generate();  // warm-up
  const wall = [], cpu = [];
  for (let i = 0; i < reps; ++i) {
    const c0 = process.cpuUsage(), t0 = process.hrtime.bigint();
    r = await generate();
    wall.push(Number(process.hrtime.bigint() - t0) / 1e6);
    const c = process.cpuUsage(c0);
    cpu.push((c.user + c.system) / 1e3);
  }
  writeNpy(path.join(work, 'ort_latent.npy'), new ort.Tensor('float32', r.latent, dims));
  writeNpy(path.join(work, 'ort_image.npy'), new ort.Tensor('float32', r.image, r.imageDims));
  const med = (v) => [...v].sort((p, q) => p - q)[Math.floor(v.length / 2)];
  console.log(JSON.stringify({ peer: `onnxruntime-node ${require('onnxruntime-node/package.json').version}`,
                               median_ms: med(wall), min_ms: Math.min(...wall), cpu_ms: med(cpu), steps,
                               guidance: g, repetitions: reps, threads }));
}

module.exports = { ddim, idsTensor, denoise, decode };

if (require.main === module) {
  main().catch((e) => {
    console.error(e.stack || String(e));
    process.exit(1);
  });
}
