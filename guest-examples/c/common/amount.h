/*
 * The "amount" of a record's JSON data, read the way the Python examples'
 * json.loads reads it (see batch-sum/batch_sum.c for the rules): shared by
 * batch-sum and running-total.
 *
 * A small JSON reader by hand: a JSON library would add far more code to
 * each component than these few functions, and only the one member is
 * wanted. Everything is `static inline`, as in guest_util.h.
 */
#ifndef SHARDLANE_AMOUNT_H
#define SHARDLANE_AMOUNT_H

#include "guest_util.h"

/* Deepest nesting of arrays and objects accepted. The reader recurses once
 * per level; 512 levels stay far inside wasmtime's default 512 KiB of native
 * stack, and Python's own json gives up near 1000. */
#define MAX_DEPTH 512

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
    int depth;
} reader_t;

static inline void skip_ws(reader_t *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) {
        r->p++;
    }
}

static inline bool eat(reader_t *r, uint8_t c) {
    if (r->p < r->end && *r->p == c) {
        r->p++;
        return true;
    }
    return false;
}

static inline int hex_val(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string, at the opening quote. When `is_amount` is given it is set to
 * whether the decoded string is exactly `amount`. (The input is already
 * known to be valid UTF-8, so raw bytes >= 0x80 need no checking here; none
 * of them can be part of "amount".) */
static inline bool read_string(reader_t *r, bool *is_amount) {
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
static inline bool read_number(reader_t *r, bool *integral, bool *fits, int64_t *value) {
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

static inline bool read_value(reader_t *r);

static inline bool read_literal(reader_t *r, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0) return false;
    r->p += n;
    return true;
}

static inline bool read_array(reader_t *r) {
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
static inline bool read_object(reader_t *r, bool *has_amount, int64_t *amount) {
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
static inline bool read_value(reader_t *r) {
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
static inline bool amount_of(const uint8_t *data, size_t len, int64_t *amount) {
    if (!utf8_valid(data, len)) return false;
    reader_t r = {data, data + len, 0};
    bool has_amount = false;
    skip_ws(&r);
    if (r.p >= r.end || *r.p != '{') return false; /* not an object */
    if (!read_object(&r, &has_amount, amount)) return false;
    skip_ws(&r);
    return r.p == r.end && has_amount;
}

#endif
