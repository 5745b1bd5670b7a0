"""Builds KPL aggregates with AWS's own aggregation library (aws-kinesis-agg).

Reads a JSON list of aggregates from stdin, each a list of user records
{"key": str, "data_base64": str, "explicit_hash_key": str | null}; writes a
JSON list with one {"key", "explicit_hash_key", "data_base64"} per
aggregate: the Kinesis record to put (the library's container key and hash
key, and the aggregate's bytes). Every aggregate must fit in one Kinesis
record: the script fails if the library splits it.
"""
import base64
import json
import sys

from aws_kinesis_agg.aggregator import RecordAggregator


def main():
    out = []
    for users in json.load(sys.stdin):
        aggregator = RecordAggregator()
        for user in users:
            full = aggregator.add_user_record(
                user["key"],
                base64.b64decode(user["data_base64"]),
                user.get("explicit_hash_key"),
            )
            if full is not None:
                sys.exit("aggregate too large for one Kinesis record")
        key, hash_key, data = aggregator.clear_and_get().get_contents()
        out.append({
            "key": key,
            "explicit_hash_key": hash_key,
            "data_base64": base64.b64encode(data).decode(),
        })
    json.dump(out, sys.stdout)


main()
