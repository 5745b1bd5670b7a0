/*
 * The batch-sum plugin (world batch-handler): each record's data must be a
 * JSON object with an integer "amount", e.g. {"amount": 5} or
 * {"amount": -3}. Valid records are acked and their amounts summed; any
 * other record is rejected with the reason
 *     expected {"amount": <integer>}
 * After the batch it logs one line:
 *     batch-sum records=<N> valid=<V> sum=<S>
 *
 * The JSON reader (../common/amount.h, shared with running-total) is small but complete: it validates the whole
 * document (RFC 8259 grammar, strict UTF-8) and only looks at the top-level
 * object's "amount" member. It reads the data the way the Python example's
 * json.loads does:
 *   - the last of duplicate "amount" keys wins, and escaped keys count
 *     ({"\u0061mount": 1} has an amount);
 *   - a number is an integer when its value is integral: 5, -3, 5.0, 1e3
 *     and 2.50e1 are; 1.5 and 1e-1 are not;
 *   - true/false/null/strings/arrays/objects are not numbers.
 * Limits (such records are rejected, never trapped on): amounts must fit a
 * signed 64-bit integer, and arrays/objects nest at most MAX_DEPTH deep.
 * The sum is kept in 128 bits, so no batch can overflow it.
 *
 * batch_handler.h is generated at build time by `wit-bindgen c` from the
 * repository's wit/ folder (see ../build.sh); it is not committed.
 */
#include "batch_handler.h"

#include "amount.h"
#include "guest_util.h"

#define REJECT_REASON "expected {\"amount\": <integer>}"


void exports_batch_handler_handle_batch(batch_handler_list_kinesis_record_t *records,
                                        batch_handler_list_outcome_t *ret) {
    size_t n = records->len;
    size_t valid = 0;
    __int128 sum = 0;

    /* The outcome list and every reject reason must come from malloc: the
     * generated post-return function (cabi_post_handle-batch) frees them
     * once the host has copied the result. An empty batch gets an empty
     * list with no allocation (post-return frees nothing when len is 0). */
    ret->len = n;
    ret->ptr = NULL;
    if (n > 0) {
        ret->ptr = malloc(n * sizeof *ret->ptr);
        if (!ret->ptr) abort();
    }

    for (size_t i = 0; i < n; i++) {
        const batch_handler_kinesis_record_t *rec = &records->ptr[i];
        batch_handler_outcome_t *out = &ret->ptr[i];
        int64_t amount;
        if (amount_of(rec->data.ptr, rec->data.len, &amount)) {
            out->tag = SHARDLANE_PLUGIN_TYPES_OUTCOME_ACK;
            valid++;
            sum += amount;
        } else {
            out->tag = SHARDLANE_PLUGIN_TYPES_OUTCOME_REJECT;
            batch_handler_string_dup(&out->val.reject, REJECT_REASON);
        }
    }

    buf_t line = {0};
    buf_str(&line, "batch-sum records=");
    buf_u64(&line, n);
    buf_str(&line, " valid=");
    buf_u64(&line, valid);
    buf_str(&line, " sum=");
    buf_i128(&line, sum);
    /* log borrows the message: the host copies it during the call. */
    batch_handler_string_t message = {line.ptr, line.len};
    shardlane_plugin_log_log(SHARDLANE_PLUGIN_LOG_LEVEL_INFO, &message);
    buf_free(&line);

    /* The argument list (the array and every record's strings and data) was
     * allocated by the host through cabi_realloc and belongs to us now. */
    batch_handler_list_kinesis_record_free(records);
}
