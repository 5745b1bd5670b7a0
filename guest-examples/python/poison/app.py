"""The poison plugin: a record whose data is `retry` fails transiently until
its third attempt, one whose data is `bad` is rejected for good, anything
else is acked. Logs one line per call."""

import wit_world
from wit_world.imports.log import Level, log
from wit_world.imports.types import (
    KinesisRecord,
    Outcome,
    Outcome_Ack,
    Outcome_Reject,
    Outcome_Retry,
)

MAX_ATTEMPTS = 3


def decide(record: KinesisRecord) -> Outcome:
    if record.data == b"retry":
        if record.attempt < MAX_ATTEMPTS:
            return Outcome_Retry(f"attempt {record.attempt} of {MAX_ATTEMPTS}")
        return Outcome_Ack()
    if record.data == b"bad":
        return Outcome_Reject("bad record")
    return Outcome_Ack()


def outcome_name(outcome: Outcome) -> str:
    match outcome:
        case Outcome_Ack():
            return "ack"
        case Outcome_Retry():
            return "retry"
        case Outcome_Reject():
            return "reject"


class WitWorld(wit_world.WitWorld):
    def handle(self, record: KinesisRecord) -> Outcome:
        outcome = decide(record)
        log(
            Level.INFO,
            f"poison key={record.partition_key} seq={record.sequence_number} "
            f"attempt={record.attempt} outcome={outcome_name(outcome)}",
        )
        return outcome
