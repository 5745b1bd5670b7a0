/*
 * The C guest library of contract shardlane:plugin@0.3.0: write a handler
 * one record at a time, export the contract's `handle-run`.
 *
 * A 0.3.0 record-handler (and windowed-record-handler) exports
 * `handle-run`: a run of one shard's records in order, handled until the
 * first that is not acked, whose outcomes come back (the host delivers the
 * records after it again). SHARDLANE_EXPORT_RUNS(world, handle) defines
 * that export around a per-record function, so a plugin never gets the
 * loop (or the ownership of its arguments and result) wrong:
 *
 *     static void handle(record_handler_run_context_t *run, uint32_t input,
 *                        const record_handler_run_record_t *record,
 *                        record_handler_outcome_t *ret) { ... }
 *     SHARDLANE_EXPORT_RUNS(record_handler, handle)
 *
 * `world` is the prefix wit-bindgen gives the world's names
 * (`record_handler`, `windowed_record_handler`); `input` is the record's
 * place in the run (what state and outputs calls name it by). `handle`
 * fills `*ret`; a reason it gives must come from malloc (the generated
 * post-return function frees the result once the host copied it).
 */
#ifndef SHARDLANE_RUNS_H
#define SHARDLANE_RUNS_H

#include <stdint.h>
#include <stdlib.h>

#define SHARDLANE_EXPORT_RUNS(world, handle)                                          \
    void exports_##world##_handle_run(world##_run_context_t *run,                     \
                                      world##_list_run_record_t *records,            \
                                      world##_list_outcome_t *ret) {                 \
        size_t n = records->len;                                                      \
        ret->len = 0;                                                                 \
        ret->ptr = NULL;                                                              \
        if (n > 0) {                                                                  \
            ret->ptr = malloc(n * sizeof *ret->ptr);                                  \
            if (!ret->ptr) abort();                                                   \
        }                                                                             \
        for (size_t i = 0; i < n; i++) {                                              \
            handle(run, (uint32_t)i, &records->ptr[i], &ret->ptr[i]);                 \
            ret->len = i + 1;                                                         \
            if (ret->ptr[i].tag != SHARDLANE_PLUGIN_TYPES_OUTCOME_ACK) break;         \
        }                                                                             \
        /* The arguments were allocated by the host through cabi_realloc and         \
         * belong to the guest now. */                                                \
        world##_list_run_record_free(records);                                        \
        world##_run_context_free(run);                                                \
    }

#endif
