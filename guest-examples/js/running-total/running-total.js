/**
 * The running-total plugin (contract `shardlane:plugin@0.2.0`, world
 * `record-handler`): for each record `{"amount": <integer>}`, adds the
 * amount to the total kept in per-key state under the record's partition
 * key (`state`, value `total`, decimal text), logs `total key=<key>
 * total=<total>`, publishes `{"key": <key>, "total": <total>, "id":
 * "<shard>/<sequence>[/<sub>]"}` to the stream named by config
 * `output_stream` when there is one, and acks. Data that is not such JSON
 * is rejected.
 *
 * The host applies each record's state writes exactly once with the
 * checkpoint; the published totals are at least once (`id` names the
 * input). Totals are BigInts: exact past 2^53.
 */
import { log } from 'shardlane:plugin/log@0.2.0';
import { publish } from 'shardlane:plugin/outputs@0.2.0';
import { get, set } from 'shardlane:plugin/state@0.2.0';
import { get as configGet } from 'wasi:config/store@0.2.0-rc.1';

const utf8 = new TextDecoder();
const encoder = new TextEncoder();

/** The integer `amount` of a JSON object, as a BigInt, or undefined. */
function amountOf(data) {
  const text = utf8.decode(data);
  let value;
  try {
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (value === null || typeof value !== 'object' || !Number.isInteger(value.amount)) {
    return undefined;
  }
  // The amount's own digits, not a float's: exact for any integer.
  const digits = /"amount"\s*:\s*(-?\d+)/.exec(text);
  return digits ? BigInt(digits[1]) : BigInt(value.amount);
}

/**
 * @param {{ partitionKey: string, shardId: string, sequenceNumber: string,
 *   subSequenceNumber?: number, data: Uint8Array }} record
 */
export function handle({ partitionKey, shardId, sequenceNumber, subSequenceNumber, data }) {
  const amount = amountOf(data);
  if (amount === undefined) {
    return { tag: 'reject', val: 'data is not {"amount": <integer>}' };
  }
  let stored;
  try {
    stored = get(0, 'total');
  } catch (e) {
    return { tag: 'retry', val: `cannot read state: ${JSON.stringify(e.payload ?? String(e))}` };
  }
  let total;
  try {
    total = (stored === undefined ? 0n : BigInt(utf8.decode(stored))) + amount;
  } catch {
    return { tag: 'reject', val: 'the stored total is not an integer' };
  }
  try {
    set(0, 'total', encoder.encode(total.toString()));
  } catch (e) {
    return { tag: 'reject', val: `cannot write state: ${JSON.stringify(e.payload ?? String(e))}` };
  }
  log('info', `total key=${partitionKey} total=${total}`);
  const stream = configGet('output_stream');
  if (stream !== undefined) {
    const id = subSequenceNumber === undefined
      ? `${shardId}/${sequenceNumber}`
      : `${shardId}/${sequenceNumber}/${subSequenceNumber}`;
    // Built by hand: JSON.stringify cannot write a BigInt.
    const output = `{"key":${JSON.stringify(partitionKey)},"total":${total},"id":${JSON.stringify(id)}}`;
    try {
      publish(0, stream, partitionKey, encoder.encode(output));
    } catch (e) {
      return { tag: 'reject', val: `cannot publish: ${JSON.stringify(e.payload ?? String(e))}` };
    }
  }
  return { tag: 'ack' };
}
