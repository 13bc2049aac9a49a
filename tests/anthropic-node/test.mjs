// The official @anthropic-ai/sdk client against a live pdlb gateway, as
// Claude Code reaches one with ANTHROPIC_BASE_URL. The gateway and the
// simulated vLLM pods are started by tests/anthropic_node_test.go, which
// passes:
//   PDLB_ANTHROPIC_URL  a gateway taking the API keys sk-good and
//                       sk-rated (2 requests and 2000 tokens a minute),
//                       serving model "m" (two vLLM pods) and model
//                       "down" (its only pod is gone)
// Run: node test.mjs (node's own test runner; exit status 1 on a failure).
import assert from 'node:assert/strict';
import test from 'node:test';
import Anthropic from '@anthropic-ai/sdk';

const baseURL = process.env.PDLB_ANTHROPIC_URL;
if (!baseURL) {
  throw new Error('PDLB_ANTHROPIC_URL must be set (tests/anthropic_node_test.go sets it)');
}

// Retries off: an error must reach the caller with the gateway's status.
// The key goes as x-api-key, as the SDK and Claude Code send it.
const client = new Anthropic({ baseURL, apiKey: 'sk-good', maxRetries: 0, timeout: 30_000 });

// A turn of Claude Code's agent loop: the billing header block, thinking,
// a tool call and its result, cache_control marks.
const system = [
  { type: 'text', text: 'x-anthropic-billing-header: cc_version=2.1.3; cch=1a2b3;' },
  { type: 'text', text: 'You are a careful coding agent.', cache_control: { type: 'ephemeral' } },
];
const tools = [{
  name: 'Read', description: 'Reads a file from the local filesystem.',
  input_schema: { type: 'object', properties: { file_path: { type: 'string' } }, required: ['file_path'] },
}];
const messages = [
  { role: 'user', content: 'Why does make test fail?' },
  { role: 'assistant', content: [
    { type: 'thinking', thinking: 'Read the test first.', signature: 'c2ln' },
    { type: 'tool_use', id: 'toolu_01', name: 'Read', input: { file_path: '/repo/x_test.go' } },
  ] },
  { role: 'user', content: [
    { type: 'tool_result', tool_use_id: 'toolu_01', content: [{ type: 'text', text: 'package x' }] },
    { type: 'text', text: 'Fix it.', cache_control: { type: 'ephemeral' } },
  ] },
];

test('messages.create: a tool loop turn, whole', async () => {
  const { data, response } = await client.messages
    .create({ model: 'm', max_tokens: 8, system, tools, messages })
    .withResponse();
  assert.equal(data.type, 'message');
  assert.equal(data.role, 'assistant');
  assert.equal(data.content[0].type, 'text');
  assert.ok(data.content[0].text.length > 0);
  assert.equal(data.stop_reason, 'max_tokens');
  assert.equal(data.usage.output_tokens, 8);
  assert.ok(data.usage.input_tokens > 0);
  assert.ok(response.headers.get('x-pdlb-pod'), 'x-pdlb-pod header');
});

test('messages.stream: text events and the final message', async () => {
  const stream = client.messages.stream({ model: 'm', max_tokens: 12, system, tools, messages });
  let text = '';
  stream.on('text', (t) => { text += t; });
  const message = await stream.finalMessage();
  assert.ok(text.length > 0, 'streamed text');
  assert.equal(message.content[0].text, text);
  assert.equal(message.stop_reason, 'max_tokens');
  assert.equal(message.usage.output_tokens, 12);
});

test('messages.countTokens counts what create prefills', async () => {
  const { input_tokens: counted } = await client.messages.countTokens({ model: 'm', system, tools, messages });
  const data = await client.messages.create({ model: 'm', max_tokens: 1, system, tools, messages });
  assert.ok(counted > 0);
  assert.equal(counted, data.usage.input_tokens);
});

// The gateway's own errors, in Anthropic's shape, typed by status.
test('an unknown model is a NotFoundError typed not_found_error', async () => {
  await assert.rejects(
    client.messages.create({ model: 'nope', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] }),
    (err) => err instanceof Anthropic.NotFoundError && err.status === 404 && err.type === 'not_found_error' && /nope/.test(err.apiMessage),
  );
});

test('a wrong key is an AuthenticationError', async () => {
  const stranger = new Anthropic({ baseURL, apiKey: 'sk-bad', maxRetries: 0 });
  await assert.rejects(
    stranger.messages.create({ model: 'm', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] }),
    (err) => err instanceof Anthropic.AuthenticationError && err.type === 'authentication_error',
  );
});

test('a model without a live pod is overloaded, which Claude Code retries', async () => {
  await assert.rejects(
    client.messages.create({ model: 'down', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] }),
    (err) => err instanceof Anthropic.APIError && err.status === 503 && err.type === 'overloaded_error',
  );
});

// The engine's refusal passes through as vLLM answered it.
test('a block vLLM refuses is the engine\'s BadRequestError', async () => {
  await assert.rejects(
    client.messages.create({ model: 'm', max_tokens: 1, messages: [{ role: 'user', content: [{ type: 'document', source: {} }] }] }),
    (err) => err instanceof Anthropic.BadRequestError && err.type === 'invalid_request_error' && /type/.test(err.apiMessage),
  );
});

test('a keyed client reads its rate limits as from Anthropic', async () => {
  const rated = new Anthropic({ baseURL, apiKey: 'sk-rated', maxRetries: 0, timeout: 30_000 });
  const hi = [{ role: 'user', content: 'hi' }];
  // Each request takes one of 2 a minute: 30s more to refill.
  for (const left of ['1', '0']) {
    const { response } = await rated.messages.create({ model: 'm', max_tokens: 4, messages: hi }).withResponse();
    const h = response.headers;
    assert.equal(h.get('anthropic-ratelimit-requests-limit'), '2');
    assert.equal(h.get('anthropic-ratelimit-requests-remaining'), left);
    assert.equal(h.get('anthropic-ratelimit-tokens-limit'), '2000');
    assert.ok(Number(h.get('anthropic-ratelimit-tokens-remaining')) < 2000, h.get('anthropic-ratelimit-tokens-remaining'));
    for (const name of ['anthropic-ratelimit-requests-reset', 'anthropic-ratelimit-tokens-reset']) {
      // A moment in RFC 3339, UTC, to the second: 2025-08-21T12:40:59Z.
      assert.match(h.get(name), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
      const in_ = Date.parse(h.get(name)) - Date.now();
      assert.ok(in_ > -1000 && in_ <= 61_000, `${name}: ${h.get(name)}`);
    }
    assert.equal(h.get('x-ratelimit-limit-requests'), null, 'OpenAI\'s names on a Messages answer');
  }
  await assert.rejects(rated.messages.create({ model: 'm', max_tokens: 4, messages: hi }), (err) => {
    assert.ok(err instanceof Anthropic.RateLimitError, `got ${err?.constructor?.name}: ${err?.message}`);
    assert.equal(err.type, 'rate_limit_error');
    assert.equal(err.headers.get('anthropic-ratelimit-requests-remaining'), '0');
    // The SDK's retry waits retry-after-ms, read before retry-after.
    const ms = Number(err.headers.get('retry-after-ms'));
    assert.ok(ms > 0 && ms <= 30_000, `retry-after-ms ${err.headers.get('retry-after-ms')}`);
    assert.equal(err.headers.get('retry-after'), String(Math.ceil(ms / 1000)));
    return true;
  });
});

test('a prompt over the key\'s tokens a minute is refused once, not retried', async () => {
  // The SDK retries a 429 by default; no wait lets this prompt through.
  let calls = 0;
  const counted = new Anthropic({
    baseURL, apiKey: 'sk-rated', maxRetries: 2, timeout: 30_000,
    fetch: (url, init) => { calls++; return fetch(url, init); },
  });
  const long = [{ role: 'user', content: 'hello '.repeat(3000) }];
  await assert.rejects(counted.messages.create({ model: 'm', max_tokens: 4, messages: long }), (err) => {
    assert.ok(err instanceof Anthropic.RateLimitError, `got ${err?.constructor?.name}: ${err?.message}`);
    assert.match(err.apiMessage ?? err.message, /Request too large/);
    return true;
  });
  assert.equal(calls, 1, 'requests sent');
});
