/**
 * The enrich plugin (contract `shardlane:plugin@0.2.0`, world
 * `record-handler`): for each record, reads `lookup_url` and
 * `output_stream` from its config (`wasi:config/store`), GETs
 * `<lookup_url>/<partition key>` over `wasi:http`, publishes
 * `{"input": <the record's data as text>, "customer": <the JSON the lookup
 * answered>, "id": "<shard>/<sequence>"}` to the output stream with the
 * record's partition key, and acks. A lookup that answers 5xx or fails asks
 * to retry; a 4xx rejects.
 *
 * The world's imports are modules named by their WIT names. `handle` is a
 * synchronous export, so the request is made with the `wasi:http` bindings
 * and waited for with `subscribe().block()` (the engine's own `fetch` needs
 * an event loop, which a synchronous export does not run).
 */
import { log } from 'shardlane:plugin/log@0.2.0';
import { publish } from 'shardlane:plugin/outputs@0.2.0';
import { get as configGet } from 'wasi:config/store@0.2.0-rc.1';
import { handle as send } from 'wasi:http/outgoing-handler@0.2.12';
import { Fields, OutgoingRequest } from 'wasi:http/types@0.2.12';

class Missing extends Error {}

/** GETs `url`; throws Missing on 4xx, Error on anything else not 2xx. */
function get(url) {
  const [scheme, rest] = url.split('://');
  const slash = rest.indexOf('/');
  const authority = slash < 0 ? rest : rest.slice(0, slash);
  const path = slash < 0 ? '/' : rest.slice(slash);
  const request = new OutgoingRequest(new Fields());
  request.setScheme({ tag: scheme === 'https' ? 'HTTPS' : 'HTTP' });
  request.setAuthority(authority);
  request.setPathWithQuery(path);
  let future;
  try {
    future = send(request, undefined);
  } catch (e) {
    // Denied (not in `http.allow`), or an invalid request.
    throw new Error(JSON.stringify(e.payload ?? e));
  }
  future.subscribe().block();
  const answer = future.get();
  if (answer === undefined || answer.tag !== 'ok' || answer.val.tag !== 'ok') {
    throw new Error(`no response: ${JSON.stringify(answer)}`);
  }
  const response = answer.val.val;
  const status = response.status();
  if (status >= 400 && status < 500) throw new Missing(`HTTP ${status}`);
  if (status < 200 || status >= 300) throw new Error(`HTTP ${status}`);
  const stream = response.consume().stream();
  const chunks = [];
  for (;;) {
    try {
      chunks.push(stream.blockingRead(64n * 1024n));
    } catch (e) {
      if (e.payload?.tag === 'closed') break;
      // E.g. over the host's `http.max_response`.
      throw new Error(e.payload?.val?.toDebugString?.() ?? String(e));
    }
  }
  const body = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const chunk of chunks) {
    body.set(chunk, at);
    at += chunk.length;
  }
  return body;
}

const utf8 = new TextDecoder();
const encoder = new TextEncoder();

/**
 * @param {{ partitionKey: string, shardId: string, sequenceNumber: string, data: Uint8Array }} record
 */
export function handle({ partitionKey, shardId, sequenceNumber, data }) {
  const lookupUrl = configGet('lookup_url');
  const outputStream = configGet('output_stream');
  if (lookupUrl === undefined || outputStream === undefined) {
    return { tag: 'reject', val: 'config needs lookup_url and output_stream' };
  }
  const url = `${lookupUrl.replace(/\/+$/, '')}/${partitionKey}`;
  let customer;
  try {
    customer = JSON.parse(utf8.decode(get(url)));
  } catch (e) {
    if (e instanceof Missing) return { tag: 'reject', val: `${url}: ${e.message}` };
    return { tag: 'retry', val: `${url}: ${e.message}` };
  }
  const output = JSON.stringify({
    input: utf8.decode(data),
    customer,
    id: `${shardId}/${sequenceNumber}`,
  });
  try {
    publish(0, outputStream, partitionKey, encoder.encode(output));
  } catch (e) {
    return { tag: 'reject', val: `cannot publish: ${JSON.stringify(e.payload ?? String(e))}` };
  }
  log('debug', `enriched key=${partitionKey}`);
  return { tag: 'ack' };
}
