/*
 * The poison plugin (world record-handler): shows the three outcomes.
 *
 *   data "retry" -> retry("attempt <n> of 3") while attempt < 3, then ack
 *   data "bad"   -> reject("bad record")
 *   anything else -> ack
 *
 * and logs one line per call, before returning:
 *   poison key=<partition-key> seq=<sequence-number> attempt=<n> outcome=<ack|retry|reject>
 *
 * record_handler.h is generated at build time by `wit-bindgen c` from the
 * repository's wit/ folder (see ../build.sh); it is not committed.
 */
#include "record_handler.h"

#include "guest_util.h"

/* Attempts delivered before a "retry" record is finally acked. */
#define MAX_ATTEMPTS 3

static bool data_is(const record_handler_list_u8_t *data, const char *text) {
    size_t n = strlen(text);
    return data->len == n && memcmp(data->ptr, text, n) == 0;
}

/* Sets `ret` to the string `s` in memory of its own: the generated
 * post-return function (cabi_post_handle) frees the outcome's string once
 * the host has copied it, so it must come from malloc, never a literal. */
static void set_owned(record_handler_string_t *ret, const uint8_t *s, size_t n) {
    record_handler_string_dup_n(ret, (const char *)s, n);
}

void exports_record_handler_handle(record_handler_kinesis_record_t *record,
                                   record_handler_outcome_t *ret) {
    const char *outcome;
    if (data_is(&record->data, "retry") && record->attempt < MAX_ATTEMPTS) {
        buf_t reason = {0};
        buf_str(&reason, "attempt ");
        buf_u64(&reason, record->attempt);
        buf_str(&reason, " of 3");
        ret->tag = SHARDLANE_PLUGIN_TYPES_OUTCOME_RETRY;
        set_owned(&ret->val.retry, reason.ptr, reason.len);
        buf_free(&reason);
        outcome = "retry";
    } else if (data_is(&record->data, "bad")) {
        static const char reason[] = "bad record";
        ret->tag = SHARDLANE_PLUGIN_TYPES_OUTCOME_REJECT;
        set_owned(&ret->val.reject, (const uint8_t *)reason, sizeof reason - 1);
        outcome = "reject";
    } else {
        ret->tag = SHARDLANE_PLUGIN_TYPES_OUTCOME_ACK;
        outcome = "ack";
    }

    buf_t line = {0};
    buf_str(&line, "poison key=");
    buf_bytes(&line, record->partition_key.ptr, record->partition_key.len);
    buf_str(&line, " seq=");
    buf_bytes(&line, record->sequence_number.ptr, record->sequence_number.len);
    buf_str(&line, " attempt=");
    buf_u64(&line, record->attempt);
    buf_str(&line, " outcome=");
    buf_str(&line, outcome);
    /* log borrows the message: the host copies it during the call. */
    record_handler_string_t message = {line.ptr, line.len};
    shardlane_plugin_log_log(SHARDLANE_PLUGIN_LOG_LEVEL_INFO, &message);
    buf_free(&line);

    /* The argument record (its strings and data) was allocated by the host
     * through cabi_realloc and belongs to us now. */
    record_handler_kinesis_record_free(record);
}
