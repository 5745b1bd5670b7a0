/**
 * The JavaScript guest library of contract `shardlane:plugin@0.3.0`: write
 * a handler one record at a time, export the contract's `handleRun`.
 *
 * A 0.3.0 record-handler (and windowed-record-handler) exports
 * `handleRun`: a run of one shard's records in order, handled until the
 * first that is not acked, whose outcomes come back (the host delivers the
 * records after it again). `handleEach` is that loop; `runs(handle)` makes
 * the export from a per-record `handle(run, input, record)`, so a plugin
 * never gets the loop wrong (a record handled after a retry would break its
 * key's order):
 *
 *     import { runs } from '../lib/shardlane-guest.js';
 *     export const handleRun = runs((run, input, record) => ({ tag: 'ack' }));
 *
 * `input` is the record's place in the run (what state and outputs calls
 * name it by). componentize-js bundles the import into the component.
 */

/**
 * Handles `records` in order with `handle(input, record)`, stopping after
 * the first outcome that is not an ack; returns the outcomes so far, one
 * per record handled.
 */
export function handleEach(records, handle) {
  const outcomes = [];
  for (let input = 0; input < records.length; input++) {
    const outcome = handle(input, records[input]);
    outcomes.push(outcome);
    if (outcome.tag !== 'ack') {
      break;
    }
  }
  return outcomes;
}

/** The `handleRun` export made of a per-record `handle(run, input, record)`. */
export function runs(handle) {
  return (run, records) => handleEach(records, (input, record) => handle(run, input, record));
}
