/**
 * The echo plugin (world `record-handler`): logs each record's partition
 * key, sequence number and data (as quoted text when it is UTF-8, as a byte
 * count otherwise), and acks it.
 *
 * componentize-js generates the bindings from the repository's `wit/` at
 * build time: the `log` interface is imported by its WIT name, and the
 * world's `handle` export is this module's `handle` function.
 */
import { log } from 'shardlane:plugin/log@0.1.0';

// `fatal` makes invalid UTF-8 throw instead of turning into U+FFFD;
// `ignoreBOM` keeps a leading byte order mark as part of the text.
const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/**
 * @param {Uint8Array} data
 * @returns {string} the data as `"text"`, or `<N bytes of binary data>`
 */
function describe(data) {
  try {
    return `"${utf8.decode(data)}"`;
  } catch {
    return `<${data.length} bytes of binary data>`;
  }
}

/**
 * Handles one record (WIT `kinesis-record`, fields in camelCase; `data` is a
 * Uint8Array) and returns its outcome, here always `ack`.
 *
 * @param {{ partitionKey: string, sequenceNumber: string, data: Uint8Array }} record
 * @returns {{ tag: 'ack' }}
 */
export function handle({ partitionKey, sequenceNumber, data }) {
  log('info', `echo key=${partitionKey} seq=${sequenceNumber} data=${describe(data)}`);
  return { tag: 'ack' };
}
