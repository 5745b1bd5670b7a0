/*
 * The enrich plugin (contract shardlane:plugin@0.2.0, world record-handler):
 * for each record, reads `lookup_url` and `output_stream` from its config
 * (wasi:config/store), GETs `<lookup_url>/<partition key>` over wasi:http,
 * publishes {"input": <the record's data as text>, "customer": <the JSON
 * the lookup answered>, "id": "<shard>/<sequence>"} to the output stream
 * with the record's partition key, and acks. A lookup that answers 5xx or
 * fails asks to retry; a 4xx rejects.
 *
 * The output is published only if the record acks, and the record settles
 * only once the output is in its stream. `id` names the input, so a
 * consumer can drop the duplicate a crash may cause (at least once).
 *
 * record_handler.h is generated at build time by `wit-bindgen c` from the
 * repository's wit/ folder (see ../build.sh); it is not committed.
 */
#include "record_handler.h"

#include "guest_util.h"

/* What a lookup came back with. */
typedef enum { FOUND, MISSING, FAILED } lookup_t;

static void set_owned(record_handler_string_t *ret, const uint8_t *s, size_t n) {
    record_handler_string_dup_n(ret, (const char *)s, n);
}

/* GETs `url` (`http://` or `https://`) into `body`; `why` says what went
 * wrong when the answer is not FOUND. */
static lookup_t get(const char *url, size_t url_len, buf_t *body, buf_t *why) {
    const char *sep = NULL;
    for (size_t i = 0; i + 3 <= url_len; i++) {
        if (memcmp(url + i, "://", 3) == 0) { sep = url + i; break; }
    }
    if (!sep) { buf_str(why, "not a URL"); return FAILED; }
    wasi_http_types_scheme_t scheme = {
        .tag = (sep - url == 5 && memcmp(url, "https", 5) == 0) ? WASI_HTTP_TYPES_SCHEME_HTTPS
                                                                 : WASI_HTTP_TYPES_SCHEME_HTTP,
    };
    const char *authority = sep + 3;
    const char *end = url + url_len;
    const char *path = authority;
    while (path < end && *path != '/') path++;
    record_handler_string_t authority_s = {(uint8_t *)authority, (size_t)(path - authority)};
    record_handler_string_t path_s = path < end ? (record_handler_string_t){(uint8_t *)path, (size_t)(end - path)}
                                                : (record_handler_string_t){(uint8_t *)"/", 1};

    wasi_http_types_own_outgoing_request_t request =
        wasi_http_types_constructor_outgoing_request(wasi_http_types_constructor_fields());
    wasi_http_types_borrow_outgoing_request_t borrowed = wasi_http_types_borrow_outgoing_request(request);
    wasi_http_types_method_outgoing_request_set_scheme(borrowed, &scheme);
    wasi_http_types_method_outgoing_request_set_authority(borrowed, &authority_s);
    wasi_http_types_method_outgoing_request_set_path_with_query(borrowed, &path_s);

    wasi_http_outgoing_handler_own_future_incoming_response_t future;
    wasi_http_outgoing_handler_error_code_t code;
    if (!wasi_http_outgoing_handler_handle(request, NULL, &future, &code)) {
        /* Denied (not in http.allow), or an invalid request. */
        buf_str(why, "request refused, error code ");
        buf_u64(why, code.tag);
        return FAILED;
    }
    wasi_http_types_borrow_future_incoming_response_t waiting =
        wasi_http_types_borrow_future_incoming_response(future);
    wasi_io_poll_own_pollable_t ready = wasi_http_types_method_future_incoming_response_subscribe(waiting);
    wasi_io_poll_method_pollable_block(wasi_io_poll_borrow_pollable(ready));
    wasi_io_poll_pollable_drop_own(ready);
    wasi_http_types_option_result_result_own_incoming_response_error_code_void_t answer;
    bool got = wasi_http_types_method_future_incoming_response_get(waiting, &answer.val);
    wasi_http_types_future_incoming_response_drop_own(future);
    if (!got || answer.val.is_err || answer.val.val.ok.is_err) {
        buf_str(why, "no response");
        return FAILED;
    }
    wasi_http_types_own_incoming_response_t response = answer.val.val.ok.val.ok;
    wasi_http_types_borrow_incoming_response_t r = wasi_http_types_borrow_incoming_response(response);
    uint16_t status = wasi_http_types_method_incoming_response_status(r);
    lookup_t result = FOUND;
    if (status < 200 || status >= 300) {
        buf_str(why, "HTTP ");
        buf_u64(why, status);
        wasi_http_types_incoming_response_drop_own(response);
        return status >= 400 && status < 500 ? MISSING : FAILED;
    }
    wasi_http_types_own_incoming_body_t incoming;
    wasi_http_types_own_input_stream_t stream;
    if (!wasi_http_types_method_incoming_response_consume(r, &incoming)) {
        buf_str(why, "no body");
        wasi_http_types_incoming_response_drop_own(response);
        return FAILED;
    }
    if (!wasi_http_types_method_incoming_body_stream(wasi_http_types_borrow_incoming_body(incoming), &stream)) {
        buf_str(why, "no body stream");
        result = FAILED;
    } else {
        for (;;) {
            record_handler_list_u8_t chunk;
            wasi_io_streams_stream_error_t err;
            if (wasi_io_streams_method_input_stream_blocking_read(
                    wasi_io_streams_borrow_input_stream(stream), 64 * 1024, &chunk, &err)) {
                buf_bytes(body, chunk.ptr, chunk.len);
                record_handler_list_u8_free(&chunk);
                continue;
            }
            if (err.tag != WASI_IO_STREAMS_STREAM_ERROR_CLOSED) {
                /* E.g. over the host's http.max_response. */
                buf_str(why, "body failed");
                wasi_io_error_error_drop_own(err.val.last_operation_failed);
                result = FAILED;
            }
            break;
        }
        wasi_io_streams_input_stream_drop_own(stream);
    }
    wasi_http_types_incoming_body_drop_own(incoming);
    wasi_http_types_incoming_response_drop_own(response);
    return result;
}

/* The config value of `key`, or false when it is not set. */
static bool config_get(const char *key, record_handler_option_string_t *value) {
    record_handler_string_t k;
    record_handler_string_set(&k, key);
    wasi_config_store_error_t err;
    return wasi_config_store_get(&k, value, &err) && value->is_some;
}

static void reply(record_handler_outcome_t *ret, uint8_t tag, buf_t *reason) {
    ret->tag = tag;
    if (tag == SHARDLANE_PLUGIN_TYPES_OUTCOME_RETRY) set_owned(&ret->val.retry, reason->ptr, reason->len);
    if (tag == SHARDLANE_PLUGIN_TYPES_OUTCOME_REJECT) set_owned(&ret->val.reject, reason->ptr, reason->len);
}

void exports_record_handler_handle(record_handler_kinesis_record_t *record,
                                   record_handler_outcome_t *ret) {
    record_handler_option_string_t lookup_url = {0}, output_stream = {0};
    buf_t url = {0}, body = {0}, why = {0}, output = {0};
    if (!config_get("lookup_url", &lookup_url) || !config_get("output_stream", &output_stream)) {
        buf_str(&why, "config needs lookup_url and output_stream");
        reply(ret, SHARDLANE_PLUGIN_TYPES_OUTCOME_REJECT, &why);
        goto done;
    }
    buf_bytes(&url, lookup_url.val.ptr, lookup_url.val.len);
    while (url.len > 0 && url.ptr[url.len - 1] == '/') url.len--;
    buf_str(&url, "/");
    buf_bytes(&url, record->partition_key.ptr, record->partition_key.len);
    switch (get((const char *)url.ptr, url.len, &body, &why)) {
    case MISSING:
        reply(ret, SHARDLANE_PLUGIN_TYPES_OUTCOME_REJECT, &why);
        goto done;
    case FAILED:
        reply(ret, SHARDLANE_PLUGIN_TYPES_OUTCOME_RETRY, &why);
        goto done;
    case FOUND:
        break;
    }
    /* The customer is the lookup's JSON, passed through as it came. */
    buf_str(&output, "{\"input\":");
    buf_json_string(&output, record->data.ptr, record->data.len);
    buf_str(&output, ",\"customer\":");
    buf_bytes(&output, body.ptr, body.len);
    buf_str(&output, ",\"id\":\"");
    buf_bytes(&output, record->shard_id.ptr, record->shard_id.len);
    buf_str(&output, "/");
    buf_bytes(&output, record->sequence_number.ptr, record->sequence_number.len);
    buf_str(&output, "\"}");
    record_handler_list_u8_t data = {output.ptr, output.len};
    shardlane_plugin_outputs_publish_error_t err;
    if (!shardlane_plugin_outputs_publish(0, &output_stream.val, &record->partition_key, &data, &err)) {
        buf_str(&why, "cannot publish");
        shardlane_plugin_outputs_publish_error_free(&err);
        reply(ret, SHARDLANE_PLUGIN_TYPES_OUTCOME_REJECT, &why);
        goto done;
    }
    ret->tag = SHARDLANE_PLUGIN_TYPES_OUTCOME_ACK;
done:
    buf_free(&url);
    buf_free(&body);
    buf_free(&why);
    buf_free(&output);
    record_handler_option_string_free(&lookup_url);
    record_handler_option_string_free(&output_stream);
    record_handler_kinesis_record_free(record); /* the argument is ours to free */
}
