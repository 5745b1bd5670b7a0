/*
 * Small helpers shared by the C guest examples: a growable byte buffer for
 * building log lines, decimal formatting, JSON strings and a UTF-8 check.
 *
 * Why not snprintf: printf pulls in libc's stdio and locale machinery (tens
 * of KB, and long-double support from compiler-rt) for three integers and a
 * few strings. These helpers use only malloc/realloc/free/memcpy, so the
 * linked module needs nothing from WASI at all.
 *
 * Everything is `static inline` so each example stays one translation unit
 * and an example that does not use a helper gets no unused-function warning.
 */
#ifndef SHARDLANE_GUEST_UTIL_H
#define SHARDLANE_GUEST_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A growable byte buffer. Not NUL-terminated: `len` bytes at `ptr`. */
typedef struct {
    uint8_t *ptr;
    size_t len;
    size_t cap;
} buf_t;

static inline void buf_reserve(buf_t *b, size_t extra) {
    if (b->len + extra <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra) cap *= 2;
    uint8_t *p = realloc(b->ptr, cap);
    /* Out of linear memory: nothing sensible to do but trap; the host then
     * redelivers the record to a fresh instance. */
    if (!p) abort();
    b->ptr = p;
    b->cap = cap;
}

static inline void buf_bytes(buf_t *b, const void *p, size_t n) {
    if (n == 0) return;
    buf_reserve(b, n);
    memcpy(b->ptr + b->len, p, n);
    b->len += n;
}

static inline void buf_str(buf_t *b, const char *s) { buf_bytes(b, s, strlen(s)); }

static inline void buf_u64(buf_t *b, uint64_t v) {
    char tmp[20];
    size_t i = sizeof tmp;
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    buf_bytes(b, tmp + i, sizeof tmp - i);
}

/* Signed 128-bit, so a batch sum of any number of int64 amounts is exact.
 * (The division by 10 comes from compiler-rt's __udivti3/__umodti3.) */
static inline void buf_i128(buf_t *b, __int128 v) {
    char tmp[41];
    size_t i = sizeof tmp;
    bool neg = v < 0;
    unsigned __int128 u = neg ? (unsigned __int128)0 - (unsigned __int128)v : (unsigned __int128)v;
    do {
        tmp[--i] = (char)('0' + (int)(u % 10));
        u /= 10;
    } while (u);
    if (neg) tmp[--i] = '-';
    buf_bytes(b, tmp + i, sizeof tmp - i);
}

/* `s` as a JSON string (quotes included). */
static inline void buf_json_string(buf_t *b, const uint8_t *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    buf_str(b, "\"");
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (c == '"' || c == '\\') {
            char esc[] = {'\\', (char)c};
            buf_bytes(b, esc, 2);
        } else if (c < 0x20) {
            char esc[] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            buf_bytes(b, esc, sizeof esc);
        } else {
            buf_bytes(b, &c, 1);
        }
    }
    buf_str(b, "\"");
}

static inline void buf_free(buf_t *b) {
    free(b->ptr);
    b->ptr = NULL;
    b->len = b->cap = 0;
}

/* Strict UTF-8 as Rust's str::from_utf8 and Python's bytes.decode("utf-8")
 * read it: no overlong forms, no surrogates, nothing above U+10FFFF. */
static inline bool utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the 2nd byte */
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;      /* overlong */
            else if (c == 0xED) hi = 0x9F; /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;      /* overlong */
            else if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
        } else {
            return false;
        }
        if (n - i - 1 < need) return false;
        if (s[i + 1] < lo || s[i + 1] > hi) return false;
        for (size_t k = 2; k <= need; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
        }
        i += need + 1;
    }
    return true;
}

#endif
