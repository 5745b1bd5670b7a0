"""The windowed-totals plugin (contract shardlane:plugin@0.3.0, world
windowed-record-handler), for a subscription with
`window = { size = "60s", by = "key" }`:

- handle (made handle-run by the guest library, lib/shardlane_guest.py):
  for each record `{"amount": <integer>}` in a window, adds the
  amount to the key's `sum` in per-key state (decimal text); a record in no
  window (late) is logged `late key=<key> amount=<n>` and acked; data that
  is not such JSON is rejected.
- close-window: for each key of the closed window, logs `window key=<key>
  start=<start> end=<end> sum=<sum>`, publishes `{"key": <key>, "start":
  <start>, "end": <end>, "sum": <sum>, "id": "<shard>/<start>/<key>"}` to
  the stream named by config `output_stream` when there is one, and deletes
  the key's `sum`.

The host commits a window's state writes (its records' and its close's)
exactly once, with the checkpoint that passes the window; the published
sums are at least once (`id` names the window)."""

import json

import wit_world
from componentize_py_types import Err
from shardlane_guest import Runs
from wit_world.imports import state, store
from wit_world.imports.log import Level, log
from wit_world.imports.outputs import publish
from wit_world.imports.runs import RunContext, RunRecord
from wit_world.imports.shardlane_plugin_types import (
    Outcome,
    Outcome_Ack,
    Outcome_Reject,
    Outcome_Retry,
)
from wit_world.imports.windows import ClosedWindow


class Retry(Exception):
    """A step that should be tried again, with its reason."""


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


def sum_of(input: int) -> int:
    """The key's `sum` of input `input`, 0 when there is none."""
    try:
        stored = state.get(input, "sum")
    except Err as e:
        raise Retry(f"cannot read state: {e.value}")
    try:
        return int(stored.decode()) if stored is not None else 0
    except ValueError:
        raise Retry("the stored sum is not an integer")


def add(input: int, record: RunRecord) -> Outcome:
    amount = amount_of(record.data)
    if amount is None:
        return Outcome_Reject('data is not {"amount": <integer>}')
    if record.window is None:
        log(Level.INFO, f"late key={record.partition_key} amount={amount}")
        return Outcome_Ack()
    try:
        total = sum_of(input) + amount
    except Retry as e:
        return Outcome_Retry(str(e))
    try:
        state.set(input, "sum", str(total).encode())
    except Err as e:
        return Outcome_Reject(f"cannot write state: {e.value}")
    return Outcome_Ack()


def close(window: ClosedWindow) -> None:
    start, end = window.window.start, window.window.end
    stream = store.get("output_stream")
    for input, key in enumerate(window.keys):
        total = sum_of(input)
        log(Level.INFO, f"window key={key} start={start} end={end} sum={total}")
        if stream is not None:
            output = json.dumps(
                {
                    "key": key,
                    "start": start,
                    "end": end,
                    "sum": total,
                    "id": f"{window.shard_id}/{start}/{key}",
                },
                separators=(",", ":"),
            )
            try:
                publish(input, stream, key, output.encode())
            except Err as e:
                raise Retry(f"cannot publish: {e.value}")
        try:
            state.delete(input, "sum")
        except Err as e:
            raise Retry(f"cannot write state: {e.value}")


class WitWorld(Runs, wit_world.WitWorld):
    # `handle_run` comes from the guest library (`Runs`), one record at a time.
    def handle(self, run: RunContext, input: int, record: RunRecord) -> Outcome:
        return add(input, record)

    def close_window(self, window: ClosedWindow) -> Outcome:
        try:
            close(window)
        except Retry as e:
            return Outcome_Retry(str(e))
        return Outcome_Ack()
