/**
 * The poison plugin (world `record-handler`): shows the three outcomes.
 *
 * - data `retry`: `retry` until the third attempt, which is acked;
 * - data `bad`: `reject`;
 * - anything else: `ack`.
 *
 * Each call logs one line naming the record and the outcome.
 */
import { log } from 'shardlane:plugin/log@0.1.0';

/** Attempt (1-based) from which a `retry` record is acked. */
const MAX_ATTEMPTS = 3;

// `ignoreBOM` keeps a leading byte order mark, so only the exact bytes
// `retry` / `bad` match; invalid UTF-8 decodes to U+FFFD and matches neither.
const utf8 = new TextDecoder('utf-8', { ignoreBOM: true });

/**
 * @param {string} text the record's data as text
 * @param {number} attempt 1 on the first delivery, +1 per redelivery
 * @returns {{ tag: 'ack' } | { tag: 'retry' | 'reject', val: string }}
 */
function decide(text, attempt) {
  switch (text) {
    case 'retry':
      return attempt < MAX_ATTEMPTS
        ? { tag: 'retry', val: `attempt ${attempt} of ${MAX_ATTEMPTS}` }
        : { tag: 'ack' };
    case 'bad':
      return { tag: 'reject', val: 'bad record' };
    default:
      return { tag: 'ack' };
  }
}

/**
 * Handles one record (WIT `kinesis-record`, fields in camelCase; `data` is a
 * Uint8Array, `attempt` a number).
 *
 * @param {{ partitionKey: string, sequenceNumber: string, data: Uint8Array, attempt: number }} record
 */
export function handle({ partitionKey, sequenceNumber, data, attempt }) {
  const outcome = decide(utf8.decode(data), attempt);
  log('info', `poison key=${partitionKey} seq=${sequenceNumber} attempt=${attempt} outcome=${outcome.tag}`);
  return outcome;
}
