#!/usr/bin/env node
// Reference client of a sequence table (R2D2) in Node.js, written from the .proto files alone: the steps of one
// episode go to a shard started with --max-sequence-length, with the overlapping windows (items) that refer to them.
//
//   1. Insert: `period` steps per request, each request with the windows that end in it (InsertRequest.items: where
//      each ends, how many steps it spans, its state at its first step, its priority); the windows reach back into
//      steps of earlier requests of the same writer_id and trajectory. At the episode's end the oldest unfinished
//      window goes out cut short.
//   2. A bad item (longer than the table's max_sequence_length) is refused with INVALID_ARGUMENT, nothing stored.
//   3. Info: size counts items, steps the steps (each stored once although two windows cover it).
//   4. Sample: items whose steps come item-major ([batch * sequence_length, ...]), padded past each item's length.
//   5. UpdatePriorities for the sampled items' keys (an item's key is its first step's key).
//
//   node sequence_client.js HOST:PORT [--token TOKEN] [--steps N] [--length L] [--period P] [--sample N]
//
// It prints one JSON line with what it did and exits 1 on any mismatch.
'use strict';

const crypto = require('node:crypto');
const { ReplayService, encodeTensor, decodeTensor, Mismatch, check, unary, insertStream, grpc } = require('./protocol');

// Step t of the episode: obs [t, -t], reward 1; the state a window starting at t carries: [t, t, t].
const stepColumns = (first, count) => {
  const ts = Array.from({ length: count }, (_, i) => first + i);
  return {
    columns: [
      { name: 'obs', tensor: encodeTensor('FLOAT32', [count, 2], ts.flatMap((t) => [t, -t])) },
      { name: 'reward', tensor: encodeTensor('FLOAT32', [count], ts.map(() => 1)) },
    ],
  };
};

// The requests of one episode of `steps` steps: `period` steps each, with the windows (start, length) that end in
// them; a window starts every `period` steps and spans `length`, the oldest unfinished one cut at the end.
function episodeRequests(writerId, trajectory, steps, length, period) {
  const starts = [];
  for (let s = 0; s < steps; s += period) starts.push(s);
  const complete = starts.filter((s) => s + length <= steps).map((s) => [s, length]);
  const cut = starts.find((s) => s + length > steps);
  const windows = cut === undefined ? complete : [...complete, [cut, steps - cut]];
  const requests = [];
  for (let first = 0, n = 1; first < steps; first += period, n++) {
    const rows = Math.min(period, steps - first);
    const mine = windows.filter(([s, len]) => s + len - 1 >= first && s + len - 1 < first + rows);
    const request = {
      writer_id: writerId,
      sequence: String(n),
      trajectory: String(trajectory), // uint64, as a string
      batch: stepColumns(first, rows),
    };
    if (mine.length) {
      request.items = {
        end: mine.map(([s, len]) => s + len - first), // the item's last step is this request's row end - 1
        length: mine.map(([, len]) => len),
        columns: {
          columns: [{ name: 'state', tensor: encodeTensor('FLOAT32', [mine.length, 3], mine.flatMap(([s]) => [s, s, s])) }],
        },
        priorities: encodeTensor('FLOAT64', [mine.length], mine.map(([s]) => 1 + (s % 3))),
      };
    }
    requests.push(request);
  }
  return { requests, windows };
}

function parseArgs(argv) {
  const args = { address: null, token: null, steps: 30, length: 8, period: 4, sample: 32 };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    if (flag === '--token') args.token = argv[++i];
    else if (['--steps', '--length', '--period', '--sample'].includes(flag)) args[flag.slice(2)] = Number(argv[++i]);
    else if (!flag.startsWith('--') && args.address === null) args.address = flag;
    else throw new Mismatch(`unknown argument ${flag}`);
  }
  if (!args.address) throw new Mismatch('usage: node sequence_client.js HOST:PORT [--token T] [--steps N] ...');
  return args;
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const client = new ReplayService(args.address, grpc.credentials.createInsecure(), {
    'grpc.max_receive_message_length': 64 * 1024 * 1024,
  });
  const metadata = new grpc.Metadata();
  if (args.token) metadata.add('authorization', `Bearer ${args.token}`);

  const before = await unary(client, 'Info', {}, metadata);
  const maxLength = Number(before.max_sequence_length);
  check(maxLength >= args.length, `the shard's max_sequence_length is ${maxLength}: start it with --max-sequence-length`);

  // 1. One episode, its windows travelling with their last steps.
  const writerId = crypto.randomUUID();
  const { requests, windows } = episodeRequests(writerId, 7, args.steps, args.length, args.period);
  const acks = await insertStream(client, metadata, requests);
  check(acks.length === requests.length, `${acks.length} acks for ${requests.length} requests`);
  acks.forEach((ack, i) => {
    check(ack.error_code === 0, `request ${ack.sequence} rejected: ${ack.error_code} ${ack.error_message}`);
    const sent = requests[i].items ? requests[i].items.end.length : 0;
    check(ack.items === sent, `request ${ack.sequence}: ${ack.items} items stored, ${sent} sent`);
  });
  const firstKey = BigInt(acks[0].first_key);

  // 2. An item longer than the table allows: refused whole, naming the field; nothing stored.
  const bad = { ...requests[requests.length - 1], sequence: String(requests.length + 1) };
  bad.items = { ...bad.items, length: bad.items.length.map(() => maxLength + 1) };
  const [refused] = await insertStream(client, metadata, [bad]);
  check(refused.error_code === grpc.status.INVALID_ARGUMENT && refused.error_message.includes('items.length'),
    `a window longer than declared: ${JSON.stringify(refused)}`);

  // 3. Info: items and steps.
  const info = await unary(client, 'Info', {}, metadata);
  const delta = (field) => BigInt(info[field]) - BigInt(before[field]);
  check(delta('size') === BigInt(windows.length), `size + ${delta('size')}, expected ${windows.length} items`);
  check(delta('steps') === BigInt(args.steps), `steps + ${delta('steps')}, expected ${args.steps} (each stored once)`);

  // 4. Sample items: steps item-major, lengths, states.
  const n = args.sample;
  const sample = await unary(client, 'Sample', { batch_size: n, no_wait: true }, metadata);
  const T = sample.sequence_length;
  check(T === maxLength, `sequence_length ${T}, the shard's max is ${maxLength}`);
  const keys = decodeTensor(sample.keys, 'keys', 'UINT64', [n]);
  const lengths = decodeTensor(sample.lengths, 'lengths', 'INT32', [n]);
  const columns = Object.fromEntries(sample.batch.columns.map((c) => [c.name, c.tensor]));
  const obs = decodeTensor(columns.obs, 'obs', 'FLOAT32', [n * T, 2]);
  const state = decodeTensor(sample.item_columns.columns[0].tensor, 'state', 'FLOAT32', [n, 3]);
  keys.forEach((key, i) => {
    if (key < firstKey) return; // another writer's item
    const start = Number(key - firstKey); // our episode's step number of the item's first step
    const window = windows.find(([s]) => s === start);
    check(window !== undefined && lengths[i] === window[1], `key ${key}: length ${lengths[i]}, window ${window}`);
    check(state[3 * i] === start, `key ${key}: state ${state[3 * i]}, expected ${start}`);
    for (let t = 0; t < T; t++) {
      const expected = start + Math.min(t, lengths[i] - 1); // padding repeats the last step
      check(obs[2 * (i * T + t)] === expected, `key ${key} step ${t}: obs ${obs[2 * (i * T + t)]}, not ${expected}`);
    }
  });

  // 5. New priorities for the sampled items.
  const update = await unary(client, 'UpdatePriorities', {
    keys: encodeTensor('UINT64', [n], keys),
    priorities: encodeTensor('FLOAT64', [n], keys.map(() => 2.5)),
    incarnation: sample.incarnation,
  }, metadata);
  check(update.applied === n, `${update.stale} of ${n} sampled item keys were stale`);

  client.close();
  console.log(JSON.stringify({
    address: args.address,
    writer_id: writerId,
    incarnation: acks[0].incarnation,
    first_key: acks[0].first_key,
    steps_inserted: args.steps,
    items_inserted: windows.length,
    requests: requests.length,
    refused_code: refused.error_code,
    sampled_items: n,
    applied_updates: update.applied,
  }));
}

main().catch((err) => {
  if (err instanceof Mismatch) console.error(`mismatch: ${err.message}`);
  else if (err.code !== undefined) console.error(`gRPC error: ${err.message}`);
  else console.error(err);
  process.exit(1);
});
