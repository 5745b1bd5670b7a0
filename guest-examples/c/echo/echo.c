/*
 * The echo plugin (world record-handler): logs each record's partition key,
 * sequence number and data (as quoted text when it is UTF-8, as a byte count
 * otherwise), and acks it.
 *
 * record_handler.h is generated at build time by `wit-bindgen c` from the
 * repository's wit/ folder (see ../build.sh); it is not committed.
 */
#include "record_handler.h"

#include "guest_util.h"

/* The data between the quotes, escaped the way Rust's `{:?}` does for the
 * characters that would break a one-line log entry: `"`, `\`, tab, CR, LF,
 * NUL and the other control characters. Any other text goes through as is. */
static void append_quoted(buf_t *b, const uint8_t *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    buf_str(b, "\"");
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        switch (c) {
        case '"': buf_str(b, "\\\""); break;
        case '\\': buf_str(b, "\\\\"); break;
        case '\t': buf_str(b, "\\t"); break;
        case '\r': buf_str(b, "\\r"); break;
        case '\n': buf_str(b, "\\n"); break;
        case '\0': buf_str(b, "\\0"); break;
        default:
            if (c < 0x20 || c == 0x7f) {
                char esc[] = {'\\', 'u', '{', hex[c >> 4], hex[c & 15], '}'};
                /* Rust writes \u{1b}, not \u{01b}; drop a leading zero. */
                if (c < 0x10) {
                    char short_esc[] = {'\\', 'u', '{', hex[c], '}'};
                    buf_bytes(b, short_esc, sizeof short_esc);
                } else {
                    buf_bytes(b, esc, sizeof esc);
                }
            } else {
                buf_bytes(b, &c, 1);
            }
        }
    }
    buf_str(b, "\"");
}

void exports_record_handler_handle(record_handler_kinesis_record_t *record,
                                   record_handler_outcome_t *ret) {
    buf_t line = {0};
    buf_str(&line, "echo key=");
    buf_bytes(&line, record->partition_key.ptr, record->partition_key.len);
    buf_str(&line, " seq=");
    buf_bytes(&line, record->sequence_number.ptr, record->sequence_number.len);
    buf_str(&line, " data=");
    if (utf8_valid(record->data.ptr, record->data.len)) {
        append_quoted(&line, record->data.ptr, record->data.len);
    } else {
        buf_str(&line, "<");
        buf_u64(&line, record->data.len);
        buf_str(&line, " bytes of binary data>");
    }

    /* log borrows the message: the host copies it during the call. */
    record_handler_string_t message = {line.ptr, line.len};
    shardlane_plugin_log_log(SHARDLANE_PLUGIN_LOG_LEVEL_INFO, &message);
    buf_free(&line);

    /* The argument record (its strings and data) was allocated by the host
     * through cabi_realloc and belongs to us now. */
    record_handler_kinesis_record_free(record);

    ret->tag = SHARDLANE_PLUGIN_TYPES_OUTCOME_ACK;
}
