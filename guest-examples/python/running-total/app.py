"""The running-total plugin (contract shardlane:plugin@0.2.0): for each
record `{"amount": <integer>}`, adds the amount to the total kept in per-key
state under the record's partition key (`state`, value `total`, decimal
text), logs `total key=<key> total=<total>`, publishes `{"key": <key>,
"total": <total>, "id": "<shard>/<sequence>[/<sub>]"}` to the stream named
by config `output_stream` when there is one, and acks. Data that is not
such JSON is rejected.

The host applies each record's state writes exactly once with the
checkpoint; the published totals are at least once (`id` names the input)."""

import json

import wit_world
from componentize_py_types import Err
from wit_world.imports import state, store
from wit_world.imports.log import Level, log
from wit_world.imports.outputs import publish
from wit_world.imports.shardlane_plugin_types import (
    KinesisRecord,
    Outcome,
    Outcome_Ack,
    Outcome_Reject,
    Outcome_Retry,
)


def amount_of(data: bytes):
    """The integer `amount` of a JSON object, or None."""
    try:
        value = json.loads(data)
    except ValueError:
        return None
    amount = value.get("amount") if isinstance(value, dict) else None
    # bool is an int in Python; JSON true is not an amount.
    if isinstance(amount, int) and not isinstance(amount, bool):
        return amount
    return None


class WitWorld(wit_world.WitWorld):
    def handle(self, record: KinesisRecord) -> Outcome:
        amount = amount_of(record.data)
        if amount is None:
            return Outcome_Reject('data is not {"amount": <integer>}')
        try:
            stored = state.get(0, "total")
        except Err as e:
            return Outcome_Retry(f"cannot read state: {e.value}")
        try:
            total = (int(stored.decode()) if stored is not None else 0) + amount
        except ValueError:
            return Outcome_Reject("the stored total is not an integer")
        try:
            state.set(0, "total", str(total).encode())
        except Err as e:
            return Outcome_Reject(f"cannot write state: {e.value}")
        log(Level.INFO, f"total key={record.partition_key} total={total}")
        stream = store.get("output_stream")
        if stream is not None:
            id = f"{record.shard_id}/{record.sequence_number}"
            if record.sub_sequence_number is not None:
                id += f"/{record.sub_sequence_number}"
            output = json.dumps(
                {"key": record.partition_key, "total": total, "id": id},
                separators=(",", ":"),
            )
            try:
                publish(0, stream, record.partition_key, output.encode())
            except Err as e:
                return Outcome_Reject(f"cannot publish: {e.value}")
        return Outcome_Ack()
