#!/usr/bin/env node
// Runs an ONNX model with ONNX Runtime (CPU) on .npy inputs and writes its outputs as .npy files.
//
// Usage: node tools/ort/run_reference.js MODEL.onnx INPUT_DIR OUTPUT_DIR
//
// Every model input must have INPUT_DIR/<name>.npy, where characters of the name outside
// [A-Za-z0-9_.-] are replaced by '_'; outputs are written the same way to OUTPUT_DIR. ORT runs with
// graph optimizations disabled (it computes the graph as written: no fusions that change rounding)
// and one thread (the summation order, hence the bits, do not depend on the machine's cores).
'use strict';

const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

// numpy descr <-> ORT tensor type and JS typed array. Little-endian only (what np.save writes on
// every machine we use); '|' is numpy's "byte order not applicable" for one-byte types.
const DTYPES = [
  { descr: '<f4', ort: 'float32', array: Float32Array },
  { descr: '<f8', ort: 'float64', array: Float64Array },
  { descr: '<i8', ort: 'int64', array: BigInt64Array },
  { descr: '<i4', ort: 'int32', array: Int32Array },
  { descr: '|i1', ort: 'int8', array: Int8Array },
  { descr: '|u1', ort: 'uint8', array: Uint8Array },
  { descr: '|b1', ort: 'bool', array: Uint8Array },
  { descr: '<i2', ort: 'int16', array: Int16Array },
  { descr: '<u2', ort: 'uint16', array: Uint16Array },
  { descr: '<f2', ort: 'float16', array: Uint16Array },  // float16 bits (ORT's JS form)
];

function safeName(name) {
  return name.replace(/[^A-Za-z0-9_.-]/g, '_');
}

// Reads a .npy file (versions 1.0, 2.0 and 3.0; C order; the dtypes above).
function readNpy(file) {
  const buf = fs.readFileSync(file);
  const magic = Buffer.from([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]);  // \x93NUMPY
  if (buf.length < 10 || !buf.subarray(0, 6).equals(magic)) throw new Error(`${file}: not a .npy file`);
  const major = buf[6];
  let headerLen, headerStart;
  if (major === 1) {
    headerLen = buf.readUInt16LE(8);
    headerStart = 10;
  } else if (major === 2 || major === 3) {
    headerLen = buf.readUInt32LE(8);
    headerStart = 12;
  } else {
    throw new Error(`${file}: unsupported .npy version ${major}.${buf[7]}`);
  }
  const header = buf.toString(major === 3 ? 'utf8' : 'latin1', headerStart, headerStart + headerLen);
  const descr = /'descr':\s*'([^']+)'/.exec(header);
  const fortran = /'fortran_order':\s*(True|False)/.exec(header);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!descr || !fortran || !shape) throw new Error(`${file}: malformed header ${JSON.stringify(header)}`);
  if (fortran[1] === 'True') throw new Error(`${file}: Fortran-order arrays are not supported`);
  const dtype = DTYPES.find((d) => d.descr === descr[1] || d.descr === descr[1].replace(/^=/, '<'));
  if (!dtype) throw new Error(`${file}: unsupported dtype ${descr[1]}`);
  const dims = shape[1].split(',').map((s) => s.trim()).filter((s) => s.length > 0).map(Number);
  const count = dims.reduce((a, b) => a * b, 1);
  const dataStart = headerStart + headerLen;
  const bytes = count * dtype.array.BYTES_PER_ELEMENT;
  if (buf.length !== dataStart + bytes) {
    throw new Error(`${file}: ${buf.length - dataStart} data bytes, shape [${dims}] needs ${bytes}`);
  }
  // Copy into a fresh, aligned ArrayBuffer (the file's data offset need not be aligned for the type).
  const data = new dtype.array(count);
  Buffer.from(data.buffer).set(buf.subarray(dataStart, dataStart + bytes));
  return new ort.Tensor(dtype.ort, data, dims);
}

// Writes a tensor as np.save does: version 1.0, header dict padded with spaces and a final '\n' so
// the data starts on a 64-byte boundary.
function writeNpy(file, tensor) {
  const dtype = DTYPES.find((d) => d.ort === tensor.type);
  if (!dtype) throw new Error(`${file}: cannot write ORT tensor type ${tensor.type}`);
  const dims = tensor.dims.map(Number);
  const shapeText = dims.length === 1 ? `(${dims[0]},)` : `(${dims.join(', ')})`;
  let header = `{'descr': '${dtype.descr}', 'fortran_order': False, 'shape': ${shapeText}, }`;
  const unpadded = 10 + header.length + 1;
  header += ' '.repeat((64 - (unpadded % 64)) % 64) + '\n';
  if (header.length > 65535) throw new Error(`${file}: header too long for .npy version 1.0`);
  const pre = Buffer.alloc(10);
  Buffer.from([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 1, 0]).copy(pre);
  pre.writeUInt16LE(header.length, 8);
  const data = tensor.data;
  const body = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  fs.writeFileSync(file, Buffer.concat([pre, Buffer.from(header, 'latin1'), body]));
}

async function main() {
  const [modelPath, inputDir, outputDir] = process.argv.slice(2);
  if (!outputDir) {
    console.error('usage: node run_reference.js MODEL.onnx INPUT_DIR OUTPUT_DIR');
    process.exit(2);
  }
  const session = await ort.InferenceSession.create(modelPath, {
    executionProviders: ['cpu'],
    graphOptimizationLevel: 'disabled',
    intraOpNumThreads: 1,
    interOpNumThreads: 1,
    executionMode: 'sequential',
  });
  const feeds = {};
  for (const name of session.inputNames) {
    const file = path.join(inputDir, safeName(name) + '.npy');
    if (!fs.existsSync(file)) throw new Error(`${modelPath}: no input file ${file} for input '${name}'`);
    feeds[name] = readNpy(file);
  }
  const results = await session.run(feeds);
  fs.mkdirSync(outputDir, { recursive: true });
  for (const name of session.outputNames) {
    const file = path.join(outputDir, safeName(name) + '.npy');
    writeNpy(file, results[name]);
    console.log(`${file}: ${results[name].type} [${results[name].dims.join(', ')}]`);
  }
}

module.exports = { readNpy, writeNpy, safeName };

if (require.main === module) {
  main().catch((e) => {
    console.error(e.stack || String(e));
    process.exit(1);
  });
}
