"""The enrich plugin (contract shardlane:plugin@0.2.0): for each record,
reads `lookup_url` and `output_stream` from its config (wasi:config/store),
GETs `<lookup_url>/<partition key>` over wasi:http, publishes
`{"input": <the record's data as text>, "customer": <the JSON the lookup
answered>, "id": "<shard>/<sequence>"}` to the output stream with the
record's partition key, and acks. A lookup that answers 5xx or fails asks to
retry; a 4xx rejects.

The output is published only if the record acks, and the record settles
only once the output is in its stream. `id` names the input, so a consumer
can drop the duplicate a crash may cause (delivery is at least once)."""

import json

import wit_world
from componentize_py_types import Err, Ok
from wit_world.imports import outgoing_handler, store
from wit_world.imports.log import Level, log
from wit_world.imports.outputs import publish
from wit_world.imports.shardlane_plugin_types import (
    KinesisRecord,
    Outcome,
    Outcome_Ack,
    Outcome_Reject,
    Outcome_Retry,
)
from wit_world.imports.streams import StreamError_Closed
from wit_world.imports.wasi_http_types import (
    Fields,
    OutgoingRequest,
    Scheme_Http,
    Scheme_Https,
)


class Missing(Exception):
    """The lookup answered 4xx: retrying would not help."""


def get(url: str) -> bytes:
    """GETs `url`; raises Missing on 4xx, RuntimeError on anything else that
    is not 2xx."""
    scheme, _, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    request = OutgoingRequest(Fields())
    request.set_scheme(Scheme_Https() if scheme == "https" else Scheme_Http())
    request.set_authority(authority)
    request.set_path_with_query(slash + path)
    try:
        future = outgoing_handler.handle(request, None)
    except Err as e:  # denied (not in http.allow), or an invalid request
        raise RuntimeError(f"{e.value}") from None
    future.subscribe().block()
    answer = future.get()
    if answer is None or isinstance(answer, Err) or isinstance(answer.value, Err):
        raise RuntimeError(f"no response: {answer}")
    response = answer.value.value
    status = response.status()
    if 400 <= status < 500:
        raise Missing(f"HTTP {status}")
    if not 200 <= status < 300:
        raise RuntimeError(f"HTTP {status}")
    body = response.consume()
    stream = body.stream()
    chunks = []
    while True:
        try:
            chunks.append(stream.blocking_read(64 * 1024))
        except Err as e:
            if isinstance(e.value, StreamError_Closed):
                break
            # E.g. over the host's http.max_response.
            raise RuntimeError(e.value.value.to_debug_string()) from None
    return b"".join(chunks)


class WitWorld(wit_world.WitWorld):
    def handle(self, record: KinesisRecord) -> Outcome:
        lookup_url = store.get("lookup_url")
        output_stream = store.get("output_stream")
        if lookup_url is None or output_stream is None:
            return Outcome_Reject("config needs lookup_url and output_stream")
        url = f"{lookup_url.rstrip('/')}/{record.partition_key}"
        try:
            customer = json.loads(get(url))
        except Missing as e:
            return Outcome_Reject(f"{url}: {e}")
        except (RuntimeError, ValueError) as e:
            return Outcome_Retry(f"{url}: {e}")
        output = json.dumps(
            {
                "input": record.data.decode("utf-8", errors="replace"),
                "customer": customer,
                "id": f"{record.shard_id}/{record.sequence_number}",
            },
            separators=(",", ":"),
        )
        try:
            publish(0, output_stream, record.partition_key, output.encode())
        except Err as e:
            return Outcome_Reject(f"cannot publish: {e.value}")
        log(Level.DEBUG, f"enriched key={record.partition_key}")
        return Outcome_Ack()
