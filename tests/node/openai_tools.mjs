// Tool calling and structured output through the official `openai` npm
// client: a forced call (tool_choice "required" and a named function),
// streamed and not; the call and its result fed back as messages; and
// response_format json_schema / json_object. Reads {base_url, max_tokens}
// from TANDEM_E2E and prints what the client got as one JSON line, for
// tests/http_openai_client_test.cc to check.
import OpenAI from 'openai';

const input = JSON.parse(process.env.TANDEM_E2E);
const client = new OpenAI({ baseURL: `${input.base_url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const model = (await client.models.list()).data[0].id;
const common = { model, max_tokens: input.max_tokens, temperature: 0, seed: 7 };

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The weather in a city today.',
      parameters: {
        type: 'object',
        properties: { city: { enum: ['Paris', 'Oslo', 'Lima'] }, unit: { enum: ['C', 'F'] } },
        required: ['city', 'unit'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'get_time',
      parameters: { type: 'object', properties: { zone: { type: 'string', maxLength: 12 } }, required: ['zone'] },
    },
  },
];
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

// One call (parallel_tool_calls false): a model of random weights would
// otherwise go on calling up to the limit.
const required = await client.chat.completions.create({
  ...common, messages, tools, tool_choice: 'required', parallel_tool_calls: false,
});

// The same request streamed: tool_calls deltas gathered by index.
const gathered = [];
let streamFinish = null;
const stream = await client.chat.completions.create({
  ...common, messages, tools, tool_choice: 'required', parallel_tool_calls: false, stream: true,
});
for await (const chunk of stream) {
  const choice = chunk.choices[0];
  if (!choice) continue;
  for (const d of choice.delta?.tool_calls ?? []) {
    gathered[d.index] ??= { id: '', name: '', arguments: '' };
    gathered[d.index].id += d.id ?? '';
    gathered[d.index].name += d.function?.name ?? '';
    gathered[d.index].arguments += d.function?.arguments ?? '';
  }
  streamFinish = choice.finish_reason ?? streamFinish;
}

const named = await client.chat.completions.create({
  ...common, messages, tools, tool_choice: { type: 'function', function: { name: 'get_time' } },
  parallel_tool_calls: false,
});

// The call and its result go back; the model answers (or calls again).
const call = required.choices[0].message.tool_calls[0];
const followUp = await client.chat.completions.create({
  ...common,
  tools,
  messages: [
    ...messages,
    { role: 'assistant', content: null, tool_calls: [call] },
    { role: 'tool', tool_call_id: call.id, content: '18 degrees and sunny' },
  ],
});

const schema = {
  type: 'object',
  properties: { answer: { enum: ['yes', 'no'] }, confidence: { type: 'integer' } },
  required: ['answer', 'confidence'],
  additionalProperties: false,
};
const structured = await client.chat.completions.create({
  ...common, messages, response_format: { type: 'json_schema', json_schema: { name: 'verdict', schema, strict: true } },
});
let structuredStream = '';
const sStream = await client.chat.completions.create({
  ...common, messages, stream: true,
  response_format: { type: 'json_schema', json_schema: { name: 'verdict', schema, strict: true } },
});
for await (const chunk of sStream) structuredStream += chunk.choices[0]?.delta?.content ?? '';

let refused = null;
try {
  await client.chat.completions.create({
    ...common, messages,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '^a' } } },
  });
} catch (e) {
  refused = { status: e.status, param: e.param ?? e.error?.param, message: e.message };
}

console.log(JSON.stringify({
  required: required.choices[0].message,
  required_finish: required.choices[0].finish_reason,
  streamed: gathered,
  streamed_finish: streamFinish,
  named: named.choices[0].message,
  follow_up_finish: followUp.choices[0].finish_reason,
  structured: structured.choices[0].message.content,
  structured_finish: structured.choices[0].finish_reason,
  structured_stream: structuredStream,
  refused,
}));
