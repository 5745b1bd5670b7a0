"""The batch-sum plugin: each record's data must be a JSON object such as
{"amount": 5}. Valid records are acked and their amounts summed; the others
are rejected. Logs one summary line per batch."""

import json
import re

import wit_world
from wit_world.imports.log import Level, log
from wit_world.imports.types import (
    KinesisRecord,
    Outcome,
    Outcome_Ack,
    Outcome_Reject,
)

REJECT_REASON = 'expected {"amount": <integer>}'

# json's C parser recurses once per nesting level; inside a component a few
# thousand levels exhaust the WebAssembly stack and trap (no RecursionError),
# which would fail the whole batch again and again. Deeper documents are
# rejected before parsing; 128 is serde_json's limit too.
MAX_DEPTH = 128
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def too_deep(text: str) -> bool:
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False  # the common case, at C speed
    depth = 0
    for bracket in _BRACKET.findall(_JSON_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > MAX_DEPTH:
            return True
    return False


def _no_constants(name: str) -> float:
    # json accepts NaN and +/-Infinity by default; they are not JSON.
    raise ValueError(f"{name} is not JSON")


def amount_of(data: bytes) -> int | None:
    """The integer "amount" of a JSON object, or None when there is none."""
    try:
        text = data.decode("utf-8")
        if too_deep(text):
            return None
        value = json.loads(text, parse_constant=_no_constants)
    except (ValueError, RecursionError):
        # not UTF-8, not JSON, or an integer of too many digits: an invalid
        # record, never an exception that would trap the call
        return None
    if not isinstance(value, dict):
        return None
    amount = value.get("amount")
    # bool is a subclass of int in Python; JSON true/false is not a number.
    if isinstance(amount, bool):
        return None
    if isinstance(amount, int):
        return amount
    if isinstance(amount, float) and amount.is_integer():
        return int(amount)  # 5.0 is an integral number
    return None


class WitWorld(wit_world.WitWorld):
    def handle_batch(self, records: list[KinesisRecord]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        valid = 0
        total = 0
        for record in records:
            amount = amount_of(record.data)
            if amount is None:
                outcomes.append(Outcome_Reject(REJECT_REASON))
            else:
                outcomes.append(Outcome_Ack())
                valid += 1
                total += amount
        log(
            Level.INFO,
            f"batch-sum records={len(records)} valid={valid} sum={total}",
        )
        return outcomes
