/**
 * The batch-sum plugin (world `batch-handler`): reads each record's data as
 * JSON `{"amount": <integer>}`, acks the valid ones and rejects the rest,
 * then logs how many records were valid and the sum of their amounts. As in
 * the other languages, a number with a zero fraction (`5.0`, `1e3`) is an
 * integer.
 */
import { log } from 'shardlane:plugin/log@0.1.0';

const REJECT_REASON = 'expected {"amount": <integer>}';

const utf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * JSON.parse reviver that turns every integer literal (no fraction, no
 * exponent) into a BigInt taken from its source text, so amounts of any size
 * stay exact; other numbers stay numbers. Uses the JSON.parse source text
 * access (the reviver's third argument) of the SpiderMonkey engine.
 */
function integersAsBigInt(_key, value, { source } = {}) {
  return typeof value === 'number' && /^-?\d+$/.test(source) ? BigInt(source) : value;
}

/**
 * @param {Uint8Array} data
 * @returns {bigint | undefined} the amount, or undefined when the data is not
 *   a JSON object with an integer "amount"
 */
function amountOf(data) {
  try {
    const doc = JSON.parse(utf8.decode(data), integersAsBigInt);
    const amount = doc?.amount;
    if (typeof amount === 'bigint') {
      return amount;
    }
    // 5.0 and 1e3 are integral numbers too.
    return Number.isInteger(amount) ? BigInt(amount) : undefined;
  } catch {
    return undefined; // not UTF-8, or not JSON
  }
}

/**
 * Handles a batch (WIT `list<kinesis-record>`, fields in camelCase; `data` is
 * a Uint8Array) and returns one outcome per record, in order.
 *
 * @param {{ data: Uint8Array }[]} records
 * @returns {({ tag: 'ack' } | { tag: 'reject', val: string })[]}
 */
export function handleBatch(records) {
  let valid = 0;
  let sum = 0n;
  const outcomes = records.map(({ data }) => {
    const amount = amountOf(data);
    if (amount === undefined) {
      return { tag: 'reject', val: REJECT_REASON };
    }
    valid += 1;
    sum += amount;
    return { tag: 'ack' };
  });
  log('info', `batch-sum records=${records.length} valid=${valid} sum=${sum}`);
  return outcomes;
}
