#!/usr/bin/env node
// histd quick tour from Node.js (@grpc/grpc-js), the same as the Python one.
//
// The stubs are made at run time from our .proto by @grpc/proto-loader:
//
//   cd clients/examples/node && npm ci
//   node quickstart.js 127.0.0.1:50051
//
// HISTD_PROTO_DIR names the folder holding histd/v1/histd.proto (default:
// the repository's proto/); HISTD_TOKEN, if set, is sent as a bearer token.
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const protoDir = process.env.HISTD_PROTO_DIR || path.join(__dirname, '..', '..', '..', 'proto');
const definition = protoLoader.loadSync('histd/v1/histd.proto', {
  includeDirs: [protoDir, '/usr/include'],
  keepCase: true,   // field names as in the .proto: session_id
  longs: String,    // uint64 seqs and revisions as strings, never rounded
  enums: String,    // 'ROLE_USER'
  defaults: true,
  oneofs: true,     // block.block === 'text' | 'tool_call' | ...
});
const { HistoryService } = grpc.loadPackageDefinition(definition).histd.v1;

// The callback API as promises, one method at a time.
function unary(stub, method, request, metadata) {
  return new Promise((resolve, reject) => {
    stub[method](request, metadata, (err, response) => (err ? reject(err) : resolve(response)));
  });
}

const text = (role, s) => ({ role, content: [{ text: { text: s } }] });

async function main(target) {
  const stub = new HistoryService(target, grpc.credentials.createInsecure());
  const md = new grpc.Metadata();
  if (process.env.HISTD_TOKEN) md.set('authorization', 'Bearer ' + process.env.HISTD_TOKEN);
  const call = (method, request) => unary(stub, method, request, md);

  // One session per chat: the same context keys always give the same session.
  const got = await call('ResolveSession', {
    context_keys: { user: 'u-42', chat: 'c-7' }, labels: { app: 'demo' },
  });
  const sid = got.session.id;

  // Watch it live (another service would do this).
  const seen = [];
  const events = stub.Subscribe({ session_id: sid, after_seq: got.session.stats.last_seq }, md);
  const watcherDone = new Promise((resolve, reject) => {
    events.on('data', (e) => seen.push(e.event));
    events.on('end', resolve);
    events.on('error', reject);
  });

  // What one agent turn produces: the prompt, a tool call, its result, the answer.
  const turn = {
    session_id: sid,
    expected_revision: got.session.revision,
    idempotency_key: 'turn-1',
    messages: [
      text('ROLE_USER', 'Weather in Paris?'),
      { role: 'ROLE_ASSISTANT', author: 'planner',
        content: [{ tool_call: { id: 'call_1', name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
      { role: 'ROLE_TOOL',
        content: [{ tool_result: { tool_call_id: 'call_1', tool_name: 'get_weather',
                                   content: [{ text: { text: '18 C, clear' } }] } }] },
      text('ROLE_ASSISTANT', '18 C and clear in Paris.'),
    ],
  };
  const ack = await call('Append', turn);
  console.log(`appended seq ${ack.first_seq}..${ack.last_seq}, revision ${ack.revision}`);

  // A retry with the same key is answered from memory: nothing appended twice.
  const again = await call('Append', turn);
  if (!again.replayed || again.last_seq !== ack.last_seq) throw new Error('retry was not replayed');

  // A writer that lost the race learns the current revision.
  try {
    await call('Append', { session_id: sid, expected_revision: got.session.revision,
                           messages: [text('ROLE_USER', 'late')] });
    throw new Error('a stale revision was accepted');
  } catch (err) {
    if (err.code !== grpc.status.ABORTED) throw err;
    console.log('conflict:', err.details, '- current revision', err.metadata.get('histd-revision')[0]);
  }

  // What to send to the model next: the last 20 messages.
  const page = await call('GetMessages', { session_id: sid, view: 'VIEW_CONTEXT', last_n: 20 });
  for (const m of page.messages) console.log(m.seq, m.role, m.token_estimate, 'tokens');

  const tr = await call('GetToolResult', { session_id: sid, tool_call_id: 'call_1' });
  console.log('tool result:', tr.result.content[0].text.text);

  await call('DeleteSession', { session_id: sid });
  await watcherDone;
  console.log('watcher saw:', seen);
  if (JSON.stringify(seen) !== JSON.stringify(['appended', 'deleted'])) {
    throw new Error('unexpected events: ' + seen);
  }
  stub.close();
}

main(process.argv[2] || '127.0.0.1:50051').catch((err) => {
  console.error('error:', err.message || err);
  process.exit(1);
});
