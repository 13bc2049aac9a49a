// The official openai npm client against a live pdlb gateway. The gateways
// and simulated pods are started by tests/openai_node_test.go, which passes:
//   PDLB_BASE_URL          a gateway serving model "m" (healthy pods),
//                          model "whisper" (a vLLM pod with the audio
//                          APIs) and model "down" (its only pod is gone)
//   PDLB_LIMITED_BASE_URL  a gateway with max_in_flight 1 serving model
//                          "slow" (a pod at real-time speed)
//   PDLB_KEYED_BASE_URL    a gateway serving model "m" to the API key
//                          sk-node, of 2 requests and 100000 tokens a
//                          minute
// Run: node test.mjs (node's own test runner; exit status 1 on a failure).
import assert from 'node:assert/strict';
import test from 'node:test';
import OpenAI, { toFile } from 'openai';

const baseURL = process.env.PDLB_BASE_URL;
const limitedURL = process.env.PDLB_LIMITED_BASE_URL;
const keyedURL = process.env.PDLB_KEYED_BASE_URL;
if (!baseURL || !limitedURL || !keyedURL) {
  throw new Error('PDLB_BASE_URL, PDLB_LIMITED_BASE_URL and PDLB_KEYED_BASE_URL must be set (tests/openai_node_test.go sets them)');
}

// Retries off: an error must reach the caller with the gateway's status,
// not be retried away (the client retries 429 and 5xx by default).
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 30_000 });
const limited = new OpenAI({ baseURL: limitedURL, apiKey: 'unused', maxRetries: 0, timeout: 30_000 });
const keyed = new OpenAI({ baseURL: keyedURL, apiKey: 'sk-node', maxRetries: 0, timeout: 30_000 });
const messages = [{ role: 'user', content: 'hello there' }];

test('models.list names the served models', async () => {
  const ids = [];
  for await (const model of client.models.list()) ids.push(model.id);
  assert.ok(ids.includes('m'), `models ${ids}`);
});

test('chat completion, not streaming', async () => {
  const { data, response } = await client.chat.completions
    .create({ model: 'm', messages, max_tokens: 8 })
    .withResponse();
  assert.equal(data.object, 'chat.completion');
  assert.equal(data.choices.length, 1);
  assert.equal(data.choices[0].message.role, 'assistant');
  assert.ok(data.choices[0].message.content.length > 0);
  assert.equal(data.usage.completion_tokens, 8);
  assert.ok(response.headers.get('x-pdlb-pod'), 'x-pdlb-pod header');
  assert.ok(response.headers.get('x-request-id'), 'x-request-id header');
});

test('chat completion, streaming with usage', async () => {
  const stream = await client.chat.completions.create({
    model: 'm', messages, max_tokens: 12, stream: true, stream_options: { include_usage: true },
  });
  let content = '';
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    for (const c of chunk.choices) {
      content += c.delta?.content ?? '';
      finish = c.finish_reason ?? finish;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.ok(content.length > 0, 'streamed content');
  assert.equal(finish, 'length');
  assert.equal(usage?.completion_tokens, 12);
});

test('completion, not streaming', async () => {
  const c = await client.completions.create({ model: 'm', prompt: 'Once upon a time', max_tokens: 8 });
  assert.equal(c.object, 'text_completion');
  assert.ok(c.choices[0].text.length > 0);
  assert.equal(c.usage.completion_tokens, 8);
});

test('completion, streaming', async () => {
  // An engine that falls behind sends several tokens in one chunk (vLLM
  // coalesces them too), so the stream is known by its usage chunk, which
  // comes on its own after the text.
  const stream = await client.completions.create({
    model: 'm', prompt: 'Once upon a time', max_tokens: 8, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  const chunks = [];
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'text_completion');
    chunks.push(chunk);
    for (const c of chunk.choices) {
      text += c.text ?? '';
      finish = c.finish_reason ?? finish;
    }
  }
  assert.ok(chunks.length > 1, `${chunks.length} chunks`);
  const last = chunks[chunks.length - 1];
  assert.equal(last.choices.length, 0, 'the usage chunk has no choices');
  assert.equal(last.usage?.completion_tokens, 8);
  assert.ok(text.length > 0);
  assert.equal(finish, 'length');
});

// wav is a silent 16 kHz, 16-bit mono WAV file of the given seconds.
function wav(seconds) {
  const data = 32000 * seconds;
  const b = Buffer.alloc(44 + data);
  b.write('RIFF', 0);
  b.writeUInt32LE(36 + data, 4);
  b.write('WAVEfmt ', 8);
  b.writeUInt32LE(16, 16);
  b.writeUInt16LE(1, 20);
  b.writeUInt16LE(1, 22);
  b.writeUInt32LE(16000, 24);
  b.writeUInt32LE(32000, 28);
  b.writeUInt16LE(2, 32);
  b.writeUInt16LE(16, 34);
  b.write('data', 36);
  b.writeUInt32LE(data, 40);
  return b;
}

test('audio transcription, not streaming', async () => {
  const t = await client.audio.transcriptions.create({ file: await toFile(wav(3), 'speech.wav'), model: 'whisper' });
  assert.ok(t.text.length > 0);
  assert.deepEqual(t.usage, { type: 'duration', seconds: 3 });
});

test('audio transcription, streaming', async () => {
  const stream = await client.audio.transcriptions.create({
    file: await toFile(wav(3), 'speech.wav'), model: 'whisper', stream: true,
  });
  let text = '';
  let chunks = 0;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'transcription.chunk');
    chunks++;
    text += chunk.choices[0]?.delta?.content ?? '';
  }
  assert.ok(chunks > 0 && text.length > 0, `${chunks} chunks, text ${JSON.stringify(text)}`);
});

test('audio translation', async () => {
  const t = await client.audio.translations.create({ file: await toFile(wav(1), 'speech.wav'), model: 'whisper' });
  assert.ok(t.text.length > 0);
});

// expectAPIError awaits p and checks it fails with the client's error class
// for status.
async function expectAPIError(p, errorClass, status, inMessage) {
  await assert.rejects(p, (err) => {
    assert.ok(err instanceof errorClass, `got ${err?.constructor?.name}: ${err?.message}`);
    assert.ok(err instanceof OpenAI.APIError);
    assert.equal(err.status, status);
    assert.ok(err.message.includes(inMessage), `message ${JSON.stringify(err.message)} lacks ${JSON.stringify(inMessage)}`);
    assert.ok(err.type, 'error type');
    return true;
  });
}

test('unknown model: NotFoundError 404', async () => {
  await expectAPIError(client.chat.completions.create({ model: 'nope', messages }), OpenAI.NotFoundError, 404, 'nope');
  await expectAPIError(client.completions.create({ model: 'nope', prompt: 'x', stream: true }), OpenAI.NotFoundError, 404, 'nope');
});

test('bad request: BadRequestError 400 naming the parameter', async () => {
  await expectAPIError(client.chat.completions.create({ model: 'm', messages, max_tokens: -1 }), OpenAI.BadRequestError, 400, 'max_tokens');
  await expectAPIError(client.completions.create({ model: 'm', prompt: 'x', stream: 'maybe' }), OpenAI.BadRequestError, 400, 'stream');
});

test('no healthy pod: InternalServerError 503', async () => {
  await expectAPIError(client.chat.completions.create({ model: 'down', messages }), OpenAI.InternalServerError, 503, 'No healthy');
});

test('over max_in_flight: RateLimitError 429 with Retry-After', async () => {
  // A long stream holds the gateway's one slot until it is aborted.
  const held = await limited.chat.completions.create({ model: 'slow', messages, max_tokens: 5000, stream: true });
  const it = held[Symbol.asyncIterator]();
  assert.equal((await it.next()).done, false, 'the held stream started');
  try {
    await assert.rejects(limited.chat.completions.create({ model: 'slow', messages, max_tokens: 4 }), (err) => {
      assert.ok(err instanceof OpenAI.RateLimitError, `got ${err?.constructor?.name}: ${err?.message}`);
      assert.equal(err.status, 429);
      assert.ok(err.message.includes('max_in_flight'), err.message);
      assert.ok(err.headers.get('retry-after'), 'Retry-After header');
      return true;
    });
  } finally {
    held.controller.abort();
  }
});

test('a keyed client reads its rate limits as from OpenAI', async () => {
  // Each request takes one of 2 a minute: 30s more to refill.
  // As Go writes a duration: 6ms, 29.994s, 1m0s.
  const reset = /^(\d+ms|(\d+m)?\d+(\.\d+)?s)$/;
  for (const left of ['1', '0']) {
    const { response } = await keyed.chat.completions.create({ model: 'm', messages, max_tokens: 4 }).withResponse();
    const h = response.headers;
    assert.equal(h.get('x-ratelimit-limit-requests'), '2');
    assert.equal(h.get('x-ratelimit-remaining-requests'), left);
    assert.match(h.get('x-ratelimit-reset-requests'), reset);
    assert.equal(h.get('x-ratelimit-limit-tokens'), '100000');
    assert.ok(Number(h.get('x-ratelimit-remaining-tokens')) < 100000, h.get('x-ratelimit-remaining-tokens'));
    assert.match(h.get('x-ratelimit-reset-tokens'), reset);
  }
  await assert.rejects(keyed.chat.completions.create({ model: 'm', messages, max_tokens: 4 }), (err) => {
    assert.ok(err instanceof OpenAI.RateLimitError, `got ${err?.constructor?.name}: ${err?.message}`);
    assert.equal(err.headers.get('x-ratelimit-remaining-requests'), '0');
    // The SDK's retry waits retry-after-ms, read before Retry-After.
    const ms = Number(err.headers.get('retry-after-ms'));
    assert.ok(ms > 0 && ms <= 30_000, `retry-after-ms ${err.headers.get('retry-after-ms')}`);
    assert.equal(err.headers.get('retry-after'), String(Math.ceil(ms / 1000)));
    return true;
  });
});
