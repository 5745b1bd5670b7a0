"""The Python guest library of contract shardlane:plugin@0.3.0: write a
handler one record at a time, export the contract's `handle-run`.

A 0.3.0 record-handler (and windowed-record-handler) exports
`handle-run`: a run of one shard's records in order, handled until the
first that is not acked, whose outcomes come back (the host delivers the
records after it again). `handle_each` is that loop; `Runs` gives a
plugin's `WitWorld` a `handle_run` made of its per-record `handle`, so a
plugin never gets the loop wrong (a record handled after a retry would
break its key's order):

    from shardlane_guest import Runs

    class WitWorld(Runs, wit_world.WitWorld):
        def handle(self, run, input, record):   # input: the record's place
            return Outcome_Ack()                # in the run (state, outputs)

The build puts this folder on the component's module path (`toolchain.sh`).
"""

from wit_world.imports.shardlane_plugin_types import Outcome_Ack


def handle_each(records, handle):
    """Handles `records` in order with `handle(input, record)`, stopping
    after the first outcome that is not an ack; returns the outcomes so
    far, one per record handled."""
    outcomes = []
    for input, record in enumerate(records):
        outcome = handle(input, record)
        outcomes.append(outcome)
        if not isinstance(outcome, Outcome_Ack):
            break
    return outcomes


class Runs:
    """Gives `handle_run` to a `WitWorld` whose `handle(run, input,
    record)` handles one record."""

    def handle_run(self, run, records):
        return handle_each(records, lambda input, record: self.handle(run, input, record))
