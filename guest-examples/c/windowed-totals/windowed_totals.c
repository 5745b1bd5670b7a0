/*
 * The windowed-totals plugin (contract shardlane:plugin@0.3.0, world
 * windowed-record-handler), for a subscription with
 * window = { size = "60s", by = "key" }:
 * - handle-run: for each record {"amount": <integer>} in a window, adds the
 *   amount to the key's `sum` in per-key state (decimal text); a record in
 *   no window (late) is logged `late key=<key> amount=<n>` and acked; data
 *   that is not such JSON is rejected.
 * - close-window: for each key of the closed window, logs
 *     window key=<key> start=<start> end=<end> sum=<sum>
 *   publishes {"key": <key>, "start": <start>, "end": <end>, "sum": <sum>,
 *   "id": "<shard>/<start>/<key>"} to the stream named by config
 *   `output_stream` when there is one, and deletes the key's `sum`.
 *
 * The host commits a window's state writes (its records' and its close's)
 * exactly once, with the checkpoint that passes the window; the published
 * sums are at least once (`id` names the window). Sums are kept in 128
 * bits.
 *
 * windowed_record_handler.h is generated at build time by `wit-bindgen c`
 * from the repository's wit/ folder (see ../build.sh); it is not committed.
 */
#include "windowed_record_handler.h"

#include "amount.h"
#include "guest_util.h"
#include "shardlane_runs.h"

typedef windowed_record_handler_outcome_t outcome_t;
typedef windowed_record_handler_string_t string_t;

static void reply(outcome_t *ret, uint8_t tag, const char *reason) {
    ret->tag = tag;
    if (tag == SHARDLANE_PLUGIN_TYPES_OUTCOME_RETRY) windowed_record_handler_string_dup(&ret->val.retry, reason);
    if (tag == SHARDLANE_PLUGIN_TYPES_OUTCOME_REJECT) windowed_record_handler_string_dup(&ret->val.reject, reason);
}

static void log_line(buf_t *line) {
    /* log borrows the message: the host copies it during the call. */
    string_t message = {line->ptr, line->len};
    shardlane_plugin_log_log(SHARDLANE_PLUGIN_LOG_LEVEL_INFO, &message);
}

/* The key's `sum` of input `input` (0 when there is none); false with
 * `why` set when it cannot be read or is not a number. */
static bool sum_of(uint32_t input, __int128 *sum, const char **why) {
    string_t name;
    windowed_record_handler_string_set(&name, "sum");
    windowed_record_handler_option_list_u8_t stored;
    shardlane_plugin_state_state_error_t err;
    if (!shardlane_plugin_state_get(input, &name, &stored, &err)) {
        *why = "cannot read state";
        return false;
    }
    *sum = 0;
    bool ok = true;
    if (stored.is_some) {
        const uint8_t *s = stored.val.ptr;
        size_t n = stored.val.len, i = 0;
        bool neg = n > 0 && s[0] == '-';
        if (neg) i++;
        ok = i < n;
        for (; ok && i < n; i++) {
            ok = s[i] >= '0' && s[i] <= '9';
            *sum = *sum * 10 + (s[i] - '0');
        }
        if (neg) *sum = -*sum;
    }
    windowed_record_handler_option_list_u8_free(&stored);
    if (!ok) *why = "the stored sum is not an integer";
    return ok;
}

static void add(uint32_t input, const windowed_record_handler_run_record_t *record, outcome_t *ret) {
    int64_t amount;
    if (!amount_of(record->data.ptr, record->data.len, &amount)) {
        reply(ret, SHARDLANE_PLUGIN_TYPES_OUTCOME_REJECT, "data is not {\"amount\": <integer>}");
        return;
    }
    if (!record->window.is_some) {
        buf_t line = {0};
        buf_str(&line, "late key=");
        buf_bytes(&line, record->partition_key.ptr, record->partition_key.len);
        buf_str(&line, " amount=");
        buf_i128(&line, amount);
        log_line(&line);
        buf_free(&line);
        ret->tag = SHARDLANE_PLUGIN_TYPES_OUTCOME_ACK;
        return;
    }
    __int128 sum;
    const char *why;
    if (!sum_of(input, &sum, &why)) {
        reply(ret, SHARDLANE_PLUGIN_TYPES_OUTCOME_RETRY, why);
        return;
    }
    sum += amount;
    buf_t text = {0};
    buf_i128(&text, sum);
    string_t name;
    windowed_record_handler_string_set(&name, "sum");
    windowed_record_handler_list_u8_t value = {text.ptr, text.len};
    shardlane_plugin_state_state_error_t err;
    if (shardlane_plugin_state_set(input, &name, &value, &err)) {
        ret->tag = SHARDLANE_PLUGIN_TYPES_OUTCOME_ACK;
    } else {
        reply(ret, SHARDLANE_PLUGIN_TYPES_OUTCOME_REJECT, "cannot write state");
    }
    buf_free(&text);
}

/* One record of a run; `handle-run` is made of it by the guest library
 * (common/shardlane_runs.h), one record at a time. */
static void handle(windowed_record_handler_run_context_t *run, uint32_t input,
                   const windowed_record_handler_run_record_t *record, outcome_t *ret) {
    (void)run;
    add(input, record, ret);
}

SHARDLANE_EXPORT_RUNS(windowed_record_handler, handle)

/* Publishes one key's sum to `stream`; false when the host refused it. */
static bool publish_sum(uint32_t input, string_t *stream, const string_t *shard, const string_t *key,
                        uint64_t start, uint64_t end, const buf_t *sum) {
    buf_t output = {0};
    buf_str(&output, "{\"key\":");
    buf_json_string(&output, key->ptr, key->len);
    buf_str(&output, ",\"start\":");
    buf_u64(&output, start);
    buf_str(&output, ",\"end\":");
    buf_u64(&output, end);
    buf_str(&output, ",\"sum\":");
    buf_bytes(&output, sum->ptr, sum->len);
    buf_str(&output, ",\"id\":");
    buf_t id = {0};
    buf_bytes(&id, shard->ptr, shard->len);
    buf_str(&id, "/");
    buf_u64(&id, start);
    buf_str(&id, "/");
    buf_bytes(&id, key->ptr, key->len);
    buf_json_string(&output, id.ptr, id.len);
    buf_str(&output, "}");
    windowed_record_handler_list_u8_t data = {output.ptr, output.len};
    string_t partition_key = *key;
    shardlane_plugin_outputs_publish_error_t err;
    bool ok = shardlane_plugin_outputs_publish(input, stream, &partition_key, &data, &err);
    if (!ok) shardlane_plugin_outputs_publish_error_free(&err);
    buf_free(&id);
    buf_free(&output);
    return ok;
}

/* Closes one key of the window; NULL, or why it should be tried again. */
static const char *close_key(uint32_t input, const windowed_record_handler_closed_window_t *w,
                             windowed_record_handler_option_string_t *stream) {
    const string_t *key = &w->keys.ptr[input];
    __int128 sum;
    const char *why = NULL;
    if (!sum_of(input, &sum, &why)) return why;
    buf_t text = {0}, line = {0};
    buf_i128(&text, sum);
    buf_str(&line, "window key=");
    buf_bytes(&line, key->ptr, key->len);
    buf_str(&line, " start=");
    buf_u64(&line, w->window.start);
    buf_str(&line, " end=");
    buf_u64(&line, w->window.end);
    buf_str(&line, " sum=");
    buf_bytes(&line, text.ptr, text.len);
    log_line(&line);
    if (stream->is_some &&
        !publish_sum(input, &stream->val, &w->shard_id, key, w->window.start, w->window.end, &text)) {
        why = "cannot publish";
    }
    buf_free(&text);
    buf_free(&line);
    if (why) return why;
    string_t name;
    windowed_record_handler_string_set(&name, "sum");
    shardlane_plugin_state_state_error_t err;
    return shardlane_plugin_state_delete(input, &name, &err) ? NULL : "cannot write state";
}

void exports_windowed_record_handler_close_window(windowed_record_handler_closed_window_t *window,
                                                  outcome_t *ret) {
    string_t config_key;
    windowed_record_handler_string_set(&config_key, "output_stream");
    windowed_record_handler_option_string_t stream = {0};
    wasi_config_store_error_t config_err;
    if (!wasi_config_store_get(&config_key, &stream, &config_err)) {
        wasi_config_store_error_free(&config_err);
        stream.is_some = false;
    }
    const char *why = NULL;
    for (size_t i = 0; i < window->keys.len && !why; i++) {
        why = close_key((uint32_t)i, window, &stream);
    }
    if (why) {
        reply(ret, SHARDLANE_PLUGIN_TYPES_OUTCOME_RETRY, why);
    } else {
        ret->tag = SHARDLANE_PLUGIN_TYPES_OUTCOME_ACK;
    }
    windowed_record_handler_option_string_free(&stream);
    windowed_record_handler_closed_window_free(window);
}
