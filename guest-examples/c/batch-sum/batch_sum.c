/*
 * The batch-sum plugin (world batch-handler): each record's data must be a
 * JSON object with an integer "amount", e.g. {"amount": 5} or
 * {"amount": -3}. Valid records are acked and their amounts summed; any
 * other record is rejected with the reason
 *     expected {"amount": <integer>}
 * After the batch it logs one line:
 *     batch-sum records=<N> valid=<V> sum=<S>
 *
 * The JSON reader below is small but complete: it validates the whole
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

#include "guest_util.h"

#define REJECT_REASON "expected {\"amount\": <integer>}"

/* Deepest nesting of arrays and objects accepted. The reader recurses once
 * per level; 512 levels stay far inside wasmtime's default 512 KiB of native
 * stack, and Python's own json gives up near 1000. */
#define MAX_DEPTH 512

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
    int depth;
} reader_t;

static void skip_ws(reader_t *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) {
        r->p++;
    }
}

static bool eat(reader_t *r, uint8_t c) {
    if (r->p < r->end && *r->p == c) {
        r->p++;
        return true;
    }
    return false;
}

static int hex_val(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string, at the opening quote. When `is_amount` is given it is set to
 * whether the decoded string is exactly `amount`. (The input is already
 * known to be valid UTF-8, so raw bytes >= 0x80 need no checking here; none
 * of them can be part of "amount".) */
static bool read_string(reader_t *r, bool *is_amount) {
    static const char want[] = "amount";
    size_t matched = 0;
    bool match = true;
    if (!eat(r, '"')) return false;
    for (;;) {
        if (r->p >= r->end) return false;
        uint8_t c = *r->p++;
        uint32_t cp;
        if (c == '"') break;
        if (c < 0x20) return false; /* raw control characters are not allowed */
        if (c == '\\') {
            if (r->p >= r->end) return false;
            uint8_t e = *r->p++;
            switch (e) {
            case '"': cp = '"'; break;
            case '\\': cp = '\\'; break;
            case '/': cp = '/'; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u':
                if (r->end - r->p < 4) return false;
                cp = 0;
                for (int i = 0; i < 4; i++) {
                    int h = hex_val(*r->p++);
                    if (h < 0) return false;
                    cp = cp * 16 + (uint32_t)h;
                }
                break;
            default: return false;
            }
        } else {
            cp = c;
        }
        if (match && matched < sizeof want - 1 && cp == (uint8_t)want[matched]) {
            matched++;
        } else {
            match = false;
        }
    }
    if (is_amount) *is_amount = match && matched == sizeof want - 1;
    return true;
}

/* A number, at its first character. Sets *integral and, when the value is
 * integral and fits, *fits and *value. */
static bool read_number(reader_t *r, bool *integral, bool *fits, int64_t *value) {
    bool neg = eat(r, '-');

    /* integer part: 0 | [1-9][0-9]* */
    const uint8_t *int_start = r->p;
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return false;
    if (*r->p == '0') {
        r->p++;
    } else {
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    size_t int_len = (size_t)(r->p - int_start);

    /* fraction: '.' [0-9]+ */
    const uint8_t *frac_start = r->p;
    size_t frac_len = 0;
    if (eat(r, '.')) {
        frac_start = r->p;
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
        frac_len = (size_t)(r->p - frac_start);
        if (frac_len == 0) return false;
    }

    /* exponent: [eE] [+-]? [0-9]+, saturated: past a billion only its sign
     * matters (the value is then 0, a fraction, or far out of range). */
    int64_t exp = 0;
    if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        r->p++;
        bool exp_neg = false;
        if (!eat(r, '+')) exp_neg = eat(r, '-');
        const uint8_t *exp_start = r->p;
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
            if (exp < 1000000000) exp = exp * 10 + (*r->p - '0');
            r->p++;
        }
        if (r->p == exp_start) return false;
        if (exp_neg) exp = -exp;
    }

    /* The value is digits(int_part frac_part) * 10^(exp - frac_len). Drop
     * the leading and trailing zeros of the digit string; the value is
     * integral when what is left needs no negative power of ten. */
    size_t total = int_len + frac_len;
#define DIGIT(k) ((k) < int_len ? int_start[(k)] : frac_start[(k) - int_len])
    size_t first = 0;
    while (first < total && DIGIT(first) == '0') first++;
    *fits = true;
    *value = 0;
    if (first == total) { /* 0, -0, 0.000, 0e7: all zero */
        *integral = true;
        return true;
    }
    size_t last = total - 1;
    while (DIGIT(last) == '0') last--;
    int64_t scale = exp - (int64_t)frac_len + (int64_t)(total - 1 - last);
    if (scale < 0) {
        *integral = false;
        return true;
    }
    *integral = true;

    /* Magnitude with overflow checks: at most 2^63 when negative, 2^63 - 1
     * otherwise. */
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    uint64_t mag = 0;
    for (size_t k = first; k <= last; k++) {
        uint64_t d = (uint64_t)(DIGIT(k) - '0');
        if (mag > (limit - d) / 10) {
            *fits = false;
            return true;
        }
        mag = mag * 10 + d;
    }
    for (int64_t s = 0; s < scale; s++) {
        if (mag > limit / 10) {
            *fits = false;
            return true;
        }
        mag *= 10;
    }
#undef DIGIT
    *value = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    return true;
}

static bool read_value(reader_t *r);

static bool read_literal(reader_t *r, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0) return false;
    r->p += n;
    return true;
}

static bool read_array(reader_t *r) {
    if (!eat(r, '[')) return false;
    if (++r->depth > MAX_DEPTH) return false;
    skip_ws(r);
    if (!eat(r, ']')) {
        for (;;) {
            if (!read_value(r)) return false;
            skip_ws(r);
            if (eat(r, ']')) break;
            if (!eat(r, ',')) return false;
        }
    }
    r->depth--;
    return true;
}

/* An object, at '{'. When `amount` is given (the top-level object), the
 * last "amount" member decides: *has_amount is set when it is an integral
 * number that fits, and *amount to its value. */
static bool read_object(reader_t *r, bool *has_amount, int64_t *amount) {
    if (!eat(r, '{')) return false;
    if (++r->depth > MAX_DEPTH) return false;
    skip_ws(r);
    if (!eat(r, '}')) {
        for (;;) {
            bool is_amount = false;
            skip_ws(r);
            if (!read_string(r, has_amount ? &is_amount : NULL)) return false;
            skip_ws(r);
            if (!eat(r, ':')) return false;
            skip_ws(r);
            if (is_amount) {
                *has_amount = false;
                if (r->p < r->end && (*r->p == '-' || (*r->p >= '0' && *r->p <= '9'))) {
                    bool integral, fits;
                    int64_t v;
                    if (!read_number(r, &integral, &fits, &v)) return false;
                    *has_amount = integral && fits;
                    *amount = v;
                } else if (!read_value(r)) {
                    return false;
                }
            } else if (!read_value(r)) {
                return false;
            }
            skip_ws(r);
            if (eat(r, '}')) break;
            if (!eat(r, ',')) return false;
        }
    }
    r->depth--;
    return true;
}

/* Any JSON value, after optional whitespace. */
static bool read_value(reader_t *r) {
    skip_ws(r);
    if (r->p >= r->end) return false;
    switch (*r->p) {
    case '{': return read_object(r, NULL, NULL);
    case '[': return read_array(r);
    case '"': return read_string(r, NULL);
    case 't': return read_literal(r, "true");
    case 'f': return read_literal(r, "false");
    case 'n': return read_literal(r, "null");
    default: {
        bool integral, fits;
        int64_t v;
        return read_number(r, &integral, &fits, &v);
    }
    }
}

/* The record's amount: true and *amount set when `data` is a JSON object
 * with an integer "amount". */
static bool amount_of(const uint8_t *data, size_t len, int64_t *amount) {
    if (!utf8_valid(data, len)) return false;
    reader_t r = {data, data + len, 0};
    bool has_amount = false;
    skip_ws(&r);
    if (r.p >= r.end || *r.p != '{') return false; /* not an object */
    if (!read_object(&r, &has_amount, amount)) return false;
    skip_ws(&r);
    return r.p == r.end && has_amount;
}

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
