/*
 * The running-total plugin (contract shardlane:plugin@0.2.0, world
 * record-handler): for each record {"amount": <integer>}, adds the amount
 * to the total kept in per-key state under the record's partition key
 * (`state`, value `total`, decimal text), logs
 *     total key=<key> total=<total>
 * publishes {"key": <key>, "total": <total>, "id":
 * "<shard>/<sequence>[/<sub>]"} to the stream named by config
 * `output_stream` when there is one, and acks. Data that is not such JSON
 * is rejected.
 *
 * The host applies each record's state writes exactly once with the
 * checkpoint; the published totals are at least once (`id` names the
 * input). Totals are kept in 128 bits.
 *
 * record_handler.h is generated at build time by `wit-bindgen c` from the
 * repository's wit/ folder (see ../build.sh); it is not committed.
 */
#include "record_handler.h"

#include "amount.h"
#include "guest_util.h"

static void reply(record_handler_outcome_t *ret, uint8_t tag, const char *reason) {
    ret->tag = tag;
    if (tag == SHARDLANE_PLUGIN_TYPES_OUTCOME_RETRY) record_handler_string_dup(&ret->val.retry, reason);
    if (tag == SHARDLANE_PLUGIN_TYPES_OUTCOME_REJECT) record_handler_string_dup(&ret->val.reject, reason);
}

/* A decimal total, as the state keeps it; false when it is not one. */
static bool parse_total(const uint8_t *s, size_t n, __int128 *total) {
    size_t i = 0;
    bool neg = n > 0 && s[0] == '-';
    if (neg) i++;
    if (i == n) return false;
    __int128 v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    *total = neg ? -v : v;
    return true;
}

void exports_record_handler_handle(record_handler_kinesis_record_t *record,
                                   record_handler_outcome_t *ret) {
    int64_t amount;
    if (!amount_of(record->data.ptr, record->data.len, &amount)) {
        reply(ret, SHARDLANE_PLUGIN_TYPES_OUTCOME_REJECT, "data is not {\"amount\": <integer>}");
        return;
    }
    record_handler_string_t name;
    record_handler_string_set(&name, "total");
    record_handler_option_list_u8_t stored;
    shardlane_plugin_state_state_error_t err;
    if (!shardlane_plugin_state_get(0, &name, &stored, &err)) {
        reply(ret, SHARDLANE_PLUGIN_TYPES_OUTCOME_RETRY, "cannot read state");
        return;
    }
    __int128 total = 0;
    bool ok = !stored.is_some || parse_total(stored.val.ptr, stored.val.len, &total);
    record_handler_option_list_u8_free(&stored);
    if (!ok) {
        reply(ret, SHARDLANE_PLUGIN_TYPES_OUTCOME_REJECT, "the stored total is not an integer");
        return;
    }
    total += amount;

    buf_t text = {0}, line = {0}, output = {0};
    buf_i128(&text, total);
    record_handler_list_u8_t value = {text.ptr, text.len};
    if (!shardlane_plugin_state_set(0, &name, &value, &err)) {
        reply(ret, SHARDLANE_PLUGIN_TYPES_OUTCOME_REJECT, "cannot write state");
        goto done;
    }
    buf_str(&line, "total key=");
    buf_bytes(&line, record->partition_key.ptr, record->partition_key.len);
    buf_str(&line, " total=");
    buf_bytes(&line, text.ptr, text.len);
    /* log borrows the message: the host copies it during the call. */
    record_handler_string_t message = {line.ptr, line.len};
    shardlane_plugin_log_log(SHARDLANE_PLUGIN_LOG_LEVEL_INFO, &message);

    record_handler_string_t key;
    record_handler_string_set(&key, "output_stream");
    record_handler_option_string_t stream = {0};
    wasi_config_store_error_t config_err;
    bool have = wasi_config_store_get(&key, &stream, &config_err);
    if (!have) wasi_config_store_error_free(&config_err);
    if (have && stream.is_some) {
        buf_str(&output, "{\"key\":");
        buf_json_string(&output, record->partition_key.ptr, record->partition_key.len);
        buf_str(&output, ",\"total\":");
        buf_bytes(&output, text.ptr, text.len);
        buf_str(&output, ",\"id\":\"");
        buf_bytes(&output, record->shard_id.ptr, record->shard_id.len);
        buf_str(&output, "/");
        buf_bytes(&output, record->sequence_number.ptr, record->sequence_number.len);
        if (record->sub_sequence_number.is_some) {
            buf_str(&output, "/");
            buf_u64(&output, record->sub_sequence_number.val);
        }
        buf_str(&output, "\"}");
        record_handler_list_u8_t data = {output.ptr, output.len};
        shardlane_plugin_outputs_publish_error_t publish_err;
        if (!shardlane_plugin_outputs_publish(0, &stream.val, &record->partition_key, &data, &publish_err)) {
            shardlane_plugin_outputs_publish_error_free(&publish_err);
            record_handler_option_string_free(&stream);
            reply(ret, SHARDLANE_PLUGIN_TYPES_OUTCOME_REJECT, "cannot publish");
            goto done;
        }
        record_handler_option_string_free(&stream);
    }
    ret->tag = SHARDLANE_PLUGIN_TYPES_OUTCOME_ACK;
done:
    buf_free(&text);
    buf_free(&line);
    buf_free(&output);
}
