// Drives tandem-server's HTTP API with the official `openai` npm client:
// models, completions and chat completions, streamed and not, greedy. Reads
// its inputs as JSON from TANDEM_E2E ({base_url, prompt, messages,
// max_tokens}) and prints what the client got as one JSON line, for
// tests/http_openai_client_test.cc to compare with the gRPC API.
import OpenAI from 'openai';

const input = JSON.parse(process.env.TANDEM_E2E);
const client = new OpenAI({ baseURL: `${input.base_url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });

const models = await client.models.list();
const model = models.data[0].id;
const common = { model, max_tokens: input.max_tokens, temperature: 0, seed: 7 };

const completion = await client.completions.create({ ...common, prompt: input.prompt });
let completionStream = '';
let completionFinish = null;
const stream = await client.completions.create({ ...common, prompt: input.prompt, stream: true });
for await (const chunk of stream) {
  completionStream += chunk.choices[0]?.text ?? '';
  completionFinish = chunk.choices[0]?.finish_reason ?? completionFinish;
}

const chat = await client.chat.completions.create({ ...common, messages: input.messages });
let chatStream = '';
let chatFinish = null;
let usage = null;
const chatChunks = await client.chat.completions.create({
  ...common, messages: input.messages, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of chatChunks) {
  if (chunk.usage) usage = chunk.usage;
  if (chunk.choices.length === 0) continue;
  chatStream += chunk.choices[0].delta?.content ?? '';
  chatFinish = chunk.choices[0].finish_reason ?? chatFinish;
}

let errorStatus = null;
try {
  await client.completions.create({ ...common, prompt: input.prompt, temperature: -1 });
} catch (e) {
  errorStatus = e.status;
}

console.log(JSON.stringify({
  model,
  completion: completion.choices[0].text,
  completion_finish: completion.choices[0].finish_reason,
  completion_usage: completion.usage,
  completion_stream: completionStream,
  completion_stream_finish: completionFinish,
  chat: chat.choices[0].message.content,
  chat_finish: chat.choices[0].finish_reason,
  chat_stream: chatStream,
  chat_stream_finish: chatFinish,
  chat_stream_usage: usage,
  error_status: errorStatus,
}));
