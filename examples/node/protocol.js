// What every client of the apexrl ReplayService needs, written from the .proto files alone (protos/apexrl/proto):
// the contract loaded at run time, tensors as raw little-endian bytes, unary calls and the acknowledged Insert
// stream. replay_client.js (transitions) and sequence_client.js (sequence items, R2D2) use it.
'use strict';

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

// --- Loading the contract ----------------------------------------------------------------------------------------

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'protos');
const definition = protoLoader.loadSync('apexrl/proto/replay.proto', {
  includeDirs: [PROTO_ROOT], // replay.proto imports "apexrl/proto/tensor.proto" relative to this root
  keepCase: true, // field names exactly as in the .proto (writer_id, not writerId)
  longs: String, // 64-bit integers as decimal strings: a JS number (a double) would lose precision above 2**53
  enums: String, // DType values by name ('FLOAT32'); the wire carries their numbers from tensor.proto
  defaults: true, // fields the server left at their default read as 0 / '0' / false / '' instead of undefined
});
const { ReplayService } = grpc.loadPackageDefinition(definition).apexrl.v1;

// --- Tensors: raw little-endian bytes in C order -----------------------------------------------------------------

// Item size and Buffer accessors of the dtypes this client uses (tensor.proto lists all of them).
const DTYPES = {
  FLOAT32: { size: 4, write: 'writeFloatLE', read: 'readFloatLE' },
  FLOAT64: { size: 8, write: 'writeDoubleLE', read: 'readDoubleLE' },
  INT32: { size: 4, write: 'writeInt32LE', read: 'readInt32LE' },
  INT64: { size: 8, write: 'writeBigInt64LE', read: 'readBigInt64LE' }, // BigInt values
  UINT64: { size: 8, write: 'writeBigUInt64LE', read: 'readBigUInt64LE' }, // BigInt values
};

const product = (shape) => shape.reduce((a, b) => a * b, 1);

// A Tensor message from flat values in C order (row-major: the last dimension varies fastest).
function encodeTensor(dtype, shape, values) {
  const { size, write } = DTYPES[dtype];
  if (values.length !== product(shape)) {
    throw new Error(`${values.length} values for shape [${shape}]`);
  }
  const data = Buffer.alloc(values.length * size); // exactly prod(shape) * itemsize bytes
  values.forEach((value, i) => data[write](value, i * size));
  return { dtype, shape, data };
}

// Flat values of a Tensor message, after checking its dtype, shape and byte length.
function decodeTensor(tensor, what, dtype, shape) {
  const gotShape = tensor.shape.map(Number); // int64 dimensions arrive as strings; they are <= 2**31
  check(tensor.dtype === dtype, `${what}: dtype ${tensor.dtype}, expected ${dtype}`);
  check(JSON.stringify(gotShape) === JSON.stringify(shape), `${what}: shape [${gotShape}], expected [${shape}]`);
  const { size, read } = DTYPES[dtype];
  check(tensor.data.length === product(shape) * size,
    `${what}: ${tensor.data.length} bytes, expected prod([${shape}]) * ${size} = ${product(shape) * size}`);
  return Array.from({ length: product(shape) }, (_, i) => tensor.data[read](i * size));
}

// --- Calls -------------------------------------------------------------------------------------------------------

class Mismatch extends Error {}

function check(ok, message) {
  if (!ok) throw new Mismatch(message);
}

const deadline = (seconds = 10) => ({ deadline: Date.now() + seconds * 1000 });

// A unary call as a promise.
function unary(client, method, request, metadata, seconds) {
  return new Promise((resolve, reject) => {
    client[method](request, metadata, deadline(seconds), (err, reply) => (err ? reject(err) : resolve(reply)));
  });
}

// Sends `requests` on one Insert stream, keeping at most `maxInFlight` unacknowledged, and resolves with the acks.
// The shard answers every one-batch request with exactly one InsertAck, in order (and a merged request with one
// ack per run of its batches with the same outcome: one when all are stored). The stream has no deadline (it is
// meant to live long); we half-close it once every ack has arrived. A real writer keeps each batch until its ack
// arrives and resends the unacknowledged ones on a new stream if this one breaks (the shard drops those it already
// stored).
function insertStream(client, metadata, requests, maxInFlight = 4) {
  return new Promise((resolve, reject) => {
    const call = client.Insert(metadata);
    const acks = [];
    let sent = 0;
    const sendMore = () => {
      while (sent < requests.length && sent - acks.length < maxInFlight) call.write(requests[sent++]);
      if (acks.length === requests.length) call.end(); // all acknowledged: half-close, the shard then ends too
    };
    call.on('data', (ack) => {
      acks.push(ack);
      sendMore();
    });
    call.on('error', reject); // a status other than OK ends the whole stream (e.g. RESOURCE_EXHAUSTED, UNAVAILABLE)
    call.on('end', () => resolve(acks));
    sendMore();
  });
}

module.exports = { ReplayService, DTYPES, encodeTensor, decodeTensor, Mismatch, check, unary, insertStream, grpc };
