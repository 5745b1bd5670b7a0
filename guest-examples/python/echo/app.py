"""The echo plugin: logs each record's partition key, sequence number and
data (as text when it is UTF-8), and acks it."""

import wit_world
from wit_world.imports.log import Level, log
from wit_world.imports.types import KinesisRecord, Outcome, Outcome_Ack


def describe(data: bytes) -> str:
    try:
        return f'"{data.decode("utf-8")}"'
    except UnicodeDecodeError:
        return f"<{len(data)} bytes of binary data>"


class WitWorld(wit_world.WitWorld):
    def handle(self, record: KinesisRecord) -> Outcome:
        log(
            Level.INFO,
            f"echo key={record.partition_key} seq={record.sequence_number} "
            f"data={describe(record.data)}",
        )
        return Outcome_Ack()
