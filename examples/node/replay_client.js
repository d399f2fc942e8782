#!/usr/bin/env node
// Reference client of the apexrl ReplayService in Node.js, written from the .proto files alone (protos/apexrl/proto).
// It walks through the whole protocol against a running shard and checks every answer:
//
//   1. Insert: batches of CartPole-like rows over the acknowledged bidi stream (writer_id + increasing sequence),
//      the first half one batch per request, the rest merged into one request (batch_rows) answered by one ack.
//   2. Insert again: one already acknowledged batch, which must come back as a duplicate (not stored twice).
//   3. Info: the shard's counters moved by exactly what we did.
//   4. Sample: rows drawn by priority; keys (uint64), priorities (float64) and columns decoded from raw bytes.
//   5. UpdatePriorities: new priorities for the sampled keys.
//
//   node replay_client.js HOST:PORT [--token TOKEN] [--batches N] [--rows N] [--sample N]
//
// It prints one JSON line with what it did and exits 1 on any mismatch.
'use strict';

const crypto = require('node:crypto');
const {
  ReplayService, encodeTensor, decodeTensor, Mismatch, check, unary, insertStream, grpc,
} = require('./protocol');

// --- The rows we store -------------------------------------------------------------------------------------------

// A CartPole-like batch whose rows are numbered: row n has action n, obs [n, n, n, n] and next_obs n + 1, so a
// sampled row can be checked against what was inserted. Columns: obs float32[4], action int64[], reward float32[],
// discount float32[], next_obs float32[4]; the first dimension of every column is the number of rows.
function cartpoleBatch(start, rows) {
  const ids = Array.from({ length: rows }, (_, i) => start + i);
  return {
    columns: [
      { name: 'obs', tensor: encodeTensor('FLOAT32', [rows, 4], ids.flatMap((n) => Array(4).fill(n))) },
      { name: 'action', tensor: encodeTensor('INT64', [rows], ids.map(BigInt)) },
      { name: 'reward', tensor: encodeTensor('FLOAT32', [rows], ids.map(() => 1)) },
      { name: 'discount', tensor: encodeTensor('FLOAT32', [rows], ids.map(() => 0.97)) },
      { name: 'next_obs', tensor: encodeTensor('FLOAT32', [rows, 4], ids.flatMap((n) => Array(4).fill(n + 1))) },
    ],
  };
}

// The raw priority we give row n (any finite value in [0, 1e25] is accepted; float32 or float64).
const priorityOf = (n) => 0.5 + (n % 4);

// --- The walk-through --------------------------------------------------------------------------------------------

function parseArgs(argv) {
  const args = { address: null, token: null, batches: 5, rows: 64, sample: 32 };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    if (flag === '--token') args.token = argv[++i];
    else if (['--batches', '--rows', '--sample'].includes(flag)) args[flag.slice(2)] = Number(argv[++i]);
    else if (!flag.startsWith('--') && args.address === null) args.address = flag;
    else throw new Mismatch(`unknown argument ${flag}`);
  }
  if (!args.address) {
    throw new Mismatch('usage: node replay_client.js HOST:PORT [--token T] [--batches N] [--rows N] [--sample N]');
  }
  return args;
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const client = new ReplayService(args.address, grpc.credentials.createInsecure(), {
    // gRPC libraries receive at most 4 MiB by default; a shard sends up to 64 MiB (large Sample answers).
    'grpc.max_receive_message_length': 64 * 1024 * 1024,
  });
  // Every call carries the token as metadata when the shard requires one (health checks are exempt).
  const metadata = new grpc.Metadata();
  if (args.token) {
    metadata.add('authorization', `Bearer ${args.token}`);
    // Without it the shard refuses the call with UNAUTHENTICATED.
    const refused = await unary(client, 'Info', {}, new grpc.Metadata()).then(() => null, (err) => err);
    check(refused && refused.code === grpc.status.UNAUTHENTICATED, `Info without the token: ${refused}`);
  }

  const before = await unary(client, 'Info', {}, metadata);

  // 1. Insert batches. The writer_id names this writer for de-duplication: one per writer and per concurrent stream.
  const writerId = crypto.randomUUID();
  const requests = Array.from({ length: args.batches }, (_, b) => {
    const ids = Array.from({ length: args.rows }, (_, i) => b * args.rows + i);
    return {
      writer_id: writerId,
      sequence: String(b + 1), // uint64: increasing per writer; a resent batch keeps its number
      batch: cartpoleBatch(b * args.rows, args.rows),
      priorities: encodeTensor('FLOAT32', [args.rows], ids.map(priorityOf)), // omit to get the shard's max priority
    };
  });
  // The first half go one batch per request (with 3 batches or more; all of them otherwise), the rest merged (1b).
  const singles = args.batches >= 3 ? Math.ceil(args.batches / 2) : args.batches;
  const acks = await insertStream(client, metadata, requests.slice(0, singles));
  check(acks.length === singles, `${acks.length} acks for ${singles} batches`);
  acks.forEach((ack, i) => {
    // Check error_code first: first_key is 0 for duplicates and errors, and 0 is also a real key.
    check(ack.error_code === 0, `batch ${ack.sequence} rejected: ${ack.error_code} ${ack.error_message}`);
    const sent = requests[i].sequence;
    check(ack.sequence === sent && ack.batches === 1, `ack ${i} is for ${ack.batches} batch(es) up to ` +
      `sequence ${ack.sequence}, not for ${sent} alone`);
    check(!ack.duplicate && ack.rows === args.rows, `batch ${sent}: duplicate ${ack.duplicate}, ${ack.rows} rows`);
    check(ack.incarnation === acks[0].incarnation, 'the incarnation changed between acks');
  });
  // Rows got consecutive keys in insertion order: batch b's first key is the first batch's + b * rows.
  const firstKey = BigInt(acks[0].first_key);
  acks.forEach((ack, b) => check(BigInt(ack.first_key) === firstKey + BigInt(b * args.rows),
    `batch ${ack.sequence}: first_key ${ack.first_key}`));

  // 1b. The other batches merged into ONE request: their rows back to back in one Batch (and one priorities
  // tensor), batch_rows giving each batch's rows. They are numbered sequence, sequence + 1, ..., validated and
  // de-duplicated one by one as if sent alone, and one ack (batches = how many) answers all of them. Send merged
  // requests only to a shard whose acks carry `batches` (an older shard would store them as one batch).
  const merged = requests.slice(singles);
  let mergedAcks = 0;
  if (merged.length) {
    check(acks[0].batches >= 1, 'the shard does not answer with a batch count: it would not understand merging');
    const ids = Array.from({ length: merged.length * args.rows }, (_, i) => singles * args.rows + i);
    const request = {
      writer_id: writerId,
      sequence: merged[0].sequence, // the first merged batch's number; the others follow it one by one
      batch: cartpoleBatch(singles * args.rows, merged.length * args.rows),
      priorities: encodeTensor('FLOAT32', [ids.length], ids.map(priorityOf)),
      batch_rows: merged.map(() => args.rows),
    };
    const answers = await insertStream(client, metadata, [request]);
    mergedAcks = answers.length;
    const [ack] = answers;
    check(answers.length === 1 && ack.error_code === 0 && !ack.duplicate,
      `merged request: ${JSON.stringify(answers)}`);
    check(ack.batches === merged.length && ack.sequence === merged[merged.length - 1].sequence,
      `the merged request's ack answers ${ack.batches} batches up to ${ack.sequence}`);
    check(ack.rows === ids.length && BigInt(ack.first_key) === firstKey + BigInt(singles * args.rows),
      `merged request: ${ack.rows} rows from key ${ack.first_key}`);
  }
  const rowsInserted = args.batches * args.rows;

  // 2. Resend an acknowledged batch on a new stream, as after a reconnect: acknowledged again, not stored again.
  const resent = requests[Math.min(1, requests.length - 1)];
  const [dup] = await insertStream(client, metadata, [resent]);
  check(dup.error_code === 0 && dup.duplicate && dup.rows === 0 && dup.sequence === resent.sequence,
    `resent batch ${resent.sequence}: ${JSON.stringify(dup)}`);

  // 3. Info: counters moved by exactly what we did (compare 64-bit counters as BigInt).
  const info = await unary(client, 'Info', {}, metadata);
  const delta = (field) => BigInt(info[field]) - BigInt(before[field]);
  check(delta('inserted_total') === BigInt(rowsInserted), `inserted_total + ${delta('inserted_total')}`);
  check(delta('duplicate_batches_total') === 1n, `duplicate_batches_total + ${delta('duplicate_batches_total')}`);
  const expectedSize = BigInt(Math.min(Number(info.capacity), Number(before.size) + rowsInserted));
  check(BigInt(info.size) === expectedSize, `size ${info.size}, expected ${expectedSize}`);
  check(info.incarnation === acks[0].incarnation, 'Info reports another incarnation');
  const fields = info.signature.fields.map((f) => `${f.name}:${f.dtype}[${f.shape}]`).join(',');
  check(fields === 'obs:FLOAT32[4],action:INT64[],reward:FLOAT32[],discount:FLOAT32[],next_obs:FLOAT32[4]',
    `signature ${fields}`);

  // 4. Sample: keys are uint64 (BigInt), priorities float64 (stored p ** alpha), columns as inserted.
  const n = args.sample;
  const sample = await unary(client, 'Sample', { batch_size: n, no_wait: true }, metadata);
  const keys = decodeTensor(sample.keys, 'keys', 'UINT64', [n]);
  const priorities = decodeTensor(sample.priorities, 'priorities', 'FLOAT64', [n]);
  const columns = Object.fromEntries(sample.batch.columns.map((c) => [c.name, c.tensor]));
  const obs = decodeTensor(columns.obs, 'obs', 'FLOAT32', [n, 4]);
  const action = decodeTensor(columns.action, 'action', 'INT64', [n]);
  const nextObs = decodeTensor(columns.next_obs, 'next_obs', 'FLOAT32', [n, 4]);
  decodeTensor(columns.reward, 'reward', 'FLOAT32', [n]);
  decodeTensor(columns.discount, 'discount', 'FLOAT32', [n]);
  const inserted = BigInt(info.inserted_total);
  keys.forEach((key, i) => {
    // Keys held are [inserted_total - size, inserted_total).
    check(key >= inserted - BigInt(info.size) && key < inserted, `key ${key} is not held`);
    check(priorities[i] > 0 && priorities[i] <= sample.total_priority, `priority ${priorities[i]}`);
    if (key < firstKey) return; // a row some other writer stored before us
    const id = Number(key - firstKey); // our row number
    check(action[i] === BigInt(id) && obs[4 * i] === id && nextObs[4 * i] === id + 1,
      `key ${key}: action ${action[i]}, obs ${obs[4 * i]}, next_obs ${nextObs[4 * i]}; expected row ${id}`);
    const stored = Math.fround(priorityOf(id)) ** info.alpha; // the shard stores p ** alpha
    check(Math.abs(priorities[i] - stored) <= 1e-9 * stored, `key ${key}: priority ${priorities[i]}, not ${stored}`);
  });

  // 5. UpdatePriorities for the sampled keys (a key drawn twice counts twice in `applied`; the last value wins).
  const update = await unary(client, 'UpdatePriorities', {
    keys: encodeTensor('UINT64', [n], keys),
    priorities: encodeTensor('FLOAT64', [n], keys.map((_, i) => 2.0 + i / n)),
    incarnation: sample.incarnation, // keys are only valid for the incarnation that produced them
  }, metadata);
  check(update.applied + update.stale === n, `applied ${update.applied} + stale ${update.stale} != ${n}`);
  check(update.applied === n, `${update.stale} of ${n} freshly sampled keys were stale`);

  client.close();
  console.log(JSON.stringify({
    address: args.address,
    writer_id: writerId,
    incarnation: acks[0].incarnation,
    first_key: acks[0].first_key,
    batches_inserted: args.batches,
    merged_batches: merged.length,
    merged_acks: mergedAcks,
    rows_inserted: rowsInserted,
    duplicates_acked: 1,
    sampled_rows: n,
    applied_updates: update.applied,
    stale_updates: update.stale,
  }));
}

main().catch((err) => {
  if (err instanceof Mismatch) console.error(`mismatch: ${err.message}`);
  else if (err.code !== undefined) console.error(`gRPC error: ${err.message}`); // e.g. "16 UNAUTHENTICATED: ..."
  else console.error(err);
  process.exit(1);
});
