/**
 * The windowed-totals plugin (contract `shardlane:plugin@0.3.0`, world
 * `windowed-record-handler`), for a subscription with
 * `window = { size = "60s", by = "key" }`:
 * - `handleRun` (made by the guest library, `lib/shardlane-guest.js`, from a
 *   per-record handler): for each record `{"amount": <integer>}` in a window, adds
 *   the amount to the key's `sum` in per-key state (decimal text); a record
 *   in no window (late) is logged `late key=<key> amount=<n>` and acked;
 *   data that is not such JSON is rejected.
 * - `closeWindow`: for each key of the closed window, logs `window
 *   key=<key> start=<start> end=<end> sum=<sum>`, publishes `{"key": <key>,
 *   "start": <start>, "end": <end>, "sum": <sum>, "id":
 *   "<shard>/<start>/<key>"}` to the stream named by config
 *   `output_stream` when there is one, and deletes the key's `sum`.
 *
 * The host commits a window's state writes (its records' and its close's)
 * exactly once, with the checkpoint that passes the window; the published
 * sums are at least once (`id` names the window). Sums are BigInts: exact
 * past 2^53.
 */
import { log } from 'shardlane:plugin/log@0.3.0';
import { publish } from 'shardlane:plugin/outputs@0.3.0';
import { get, set, delete as remove } from 'shardlane:plugin/state@0.3.0';
import { get as configGet } from 'wasi:config/store@0.2.0-rc.1';
import { runs } from '../lib/shardlane-guest.js';

const utf8 = new TextDecoder();
const encoder = new TextEncoder();

/** A step to try again, with its reason. */
class Retry extends Error {}

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

function why(e) {
  return JSON.stringify(e.payload ?? String(e));
}

/** The key's `sum` of input `input`, 0n when there is none. */
function sumOf(input) {
  let stored;
  try {
    stored = get(input, 'sum');
  } catch (e) {
    throw new Retry(`cannot read state: ${why(e)}`);
  }
  try {
    return stored === undefined ? 0n : BigInt(utf8.decode(stored));
  } catch {
    throw new Retry('the stored sum is not an integer');
  }
}

function add(input, { partitionKey, data, window }) {
  const amount = amountOf(data);
  if (amount === undefined) {
    return { tag: 'reject', val: 'data is not {"amount": <integer>}' };
  }
  if (window === undefined) {
    log('info', `late key=${partitionKey} amount=${amount}`);
    return { tag: 'ack' };
  }
  let sum;
  try {
    sum = sumOf(input) + amount;
  } catch (e) {
    return { tag: 'retry', val: e.message };
  }
  try {
    set(input, 'sum', encoder.encode(sum.toString()));
  } catch (e) {
    return { tag: 'reject', val: `cannot write state: ${why(e)}` };
  }
  return { tag: 'ack' };
}

// `handleRun` from the guest library, one record at a time.
export const handleRun = runs((_run, input, record) => add(input, record));

export function closeWindow({ shardId, window, keys }) {
  const { start, end } = window;
  const stream = configGet('output_stream');
  try {
    keys.forEach((key, input) => {
      const sum = sumOf(input);
      log('info', `window key=${key} start=${start} end=${end} sum=${sum}`);
      if (stream !== undefined) {
        // Built by hand: JSON.stringify cannot write a BigInt.
        const id = `${shardId}/${start}/${key}`;
        const output = `{"key":${JSON.stringify(key)},"start":${start},"end":${end},"sum":${sum},"id":${JSON.stringify(id)}}`;
        try {
          publish(input, stream, key, encoder.encode(output));
        } catch (e) {
          throw new Retry(`cannot publish: ${why(e)}`);
        }
      }
      try {
        remove(input, 'sum');
      } catch (e) {
        throw new Retry(`cannot write state: ${why(e)}`);
      }
    });
  } catch (e) {
    return { tag: 'retry', val: e.message };
  }
  return { tag: 'ack' };
}
