/* Opens a dataset through gpufeed's C ABI with options given as KEY=VALUE arguments (the
 * options struct's field names), reads one epoch and prints what it saw, for tests/it/capi.rs:
 *   options KEY=VALUE... -- PATH...
 * prints "options {json}" (the dataset options in effect), "settings {json}" (the loader
 * settings in effect) and
 * "samples N padding P batches B bytes S". With keep=1 every batch is kept until a wait times
 * out (timeout_ms): "timeout MESSAGE" is printed, the kept batches are freed and the epoch
 * goes on. With verify_only=1 it calls gpufeed_verify on the first path instead and prints
 * "verify STATUS SAMPLES BAD MESSAGE". */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpufeed.h"

static int fail(const char* what, int32_t st) {
    fprintf(stderr, "%s: status %d: %s\n", what, (int)st, gpufeed_last_error());
    return 1;
}

int main(int argc, char** argv) {
    gpufeed_options o;
    if (gpufeed_options_default(&o) != GPUFEED_OK) return fail("defaults", 1);
    int keep = 0;
    int verify_only = 0;
    gpufeed_batch* kept[4096];
    uint32_t nkept = 0;
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        char* eq = strchr(argv[i], '=');
        if (eq == NULL) return fprintf(stderr, "expected KEY=VALUE: %s\n", argv[i]), 2;
        *eq = '\0';
        const char* k = argv[i];
        const char* v = eq + 1;
        if (!strcmp(k, "format")) o.format = v;
        else if (!strcmp(k, "payload")) o.payload = v;
        else if (!strcmp(k, "label_ext")) o.label_ext = v;
        else if (!strcmp(k, "label_offset")) o.label_offset = strtoll(v, NULL, 10);
        else if (!strcmp(k, "tfrecord_index")) o.tfrecord_index = v;
        else if (!strcmp(k, "tfrecord_payload")) o.tfrecord_payload = v;
        else if (!strcmp(k, "tfrecord_label")) o.tfrecord_label = v;
        else if (!strcmp(k, "tfrecord_recover")) o.tfrecord_recover = !strcmp(v, "true");
        else if (!strcmp(k, "strict")) o.strict = !strcmp(v, "true");
        else if (!strcmp(k, "token_dtype")) o.token_dtype = v;
        else if (!strcmp(k, "seq_len")) o.seq_len = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "stride")) o.stride = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "batch_size")) o.batch_size = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "rank")) o.rank = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "world_size")) o.world_size = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "last_batch")) o.last_batch = (uint8_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "order")) o.order = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "prefetch")) o.prefetch = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "timeout_ms")) o.timeout_ms = strtoull(v, NULL, 10);
        else if (!strcmp(k, "seed")) o.seed = strtoull(v, NULL, 10);
        else if (!strcmp(k, "device")) o.device = (int32_t)strtol(v, NULL, 10);
        else if (!strcmp(k, "drop_last")) o.drop_last = (uint8_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "verify")) o.verify = (uint8_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "memory_budget")) o.memory_budget = strtoull(v, NULL, 10);
        else if (!strcmp(k, "in_flight")) o.in_flight = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "queue_depth")) o.queue_depth = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "shuffle_buffer")) o.shuffle_buffer = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "open_blocks")) o.open_blocks = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "block_bytes")) o.block_bytes = strtoull(v, NULL, 10);
        else if (!strcmp(k, "open_files_max")) o.open_files_max = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "cache_dir")) o.cache_dir = v;
        else if (!strcmp(k, "cache_limit")) o.cache_limit = strtoull(v, NULL, 10);
        else if (!strcmp(k, "cache_extent")) o.cache_extent = strtoull(v, NULL, 10);
        else if (!strcmp(k, "keep")) keep = !strcmp(v, "1");
        else if (!strcmp(k, "verify_only")) verify_only = !strcmp(v, "1");
        else return fprintf(stderr, "unknown option %s\n", k), 2;
    }
    if (i >= argc - 1) return fprintf(stderr, "usage: %s KEY=VALUE... -- PATH...\n", argv[0]), 2;
    const char* paths[64];
    uint32_t n = 0;
    for (i++; i < argc && n < 64; i++) paths[n++] = argv[i];
    if (verify_only) {
        /* gpufeed_verify on the first path: "verify STATUS SAMPLES BAD MESSAGE". */
        uint64_t checked = 0, bad = 0;
        int32_t vs = gpufeed_verify(paths[0], &o, &checked, &bad);
        printf("verify %d %" PRIu64 " %" PRIu64 " %s\n", (int)vs, checked, bad,
               vs == GPUFEED_OK ? "" : gpufeed_last_error());
        return 0;
    }
    gpufeed_loader* l = NULL;
    int32_t st = gpufeed_loader_open_paths(paths, n, &o, &l);
    if (st != GPUFEED_OK) {
        /* A refused dataset (strict) says why on stdout too, for the test to read. */
        printf("refused %s\n", gpufeed_last_error());
        return fail("open", st);
    }
    printf("options %s\n", gpufeed_loader_dataset_options(l));
    printf("settings %s\n", gpufeed_loader_settings(l));
    for (uint64_t p = 0; gpufeed_loader_problem(l, p) != NULL; p++)
        printf("problem %s\n", gpufeed_loader_problem(l, p));
    printf("problems %" PRIu64 "\n", gpufeed_loader_problems(l));
    if ((st = gpufeed_loader_start_epoch(l, 0, 0)) != GPUFEED_OK) return fail("epoch", st);
    uint64_t samples = 0, padding = 0, byte_sum = 0;
    uint32_t batches = 0;
    for (;;) {
        gpufeed_batch* b = NULL;
        st = gpufeed_loader_next(l, &b);
        if (st == GPUFEED_ERR_TIMEOUT) {
            printf("timeout %s\n", gpufeed_last_error());
            while (nkept > 0) gpufeed_batch_free(kept[--nkept]);
            keep = 0;
            continue;
        }
        if (st != GPUFEED_OK) return fail("next", st);
        if (b == NULL) break;
        batches++;
        for (uint32_t j = 0; j < gpufeed_batch_len(b); j++) {
            const uint8_t* data;
            uint64_t len;
            if ((st = gpufeed_batch_sample(b, j, &data, &len)) != GPUFEED_OK) return fail("sample", st);
            samples++;
            padding += gpufeed_batch_is_padding(b, j);
            for (uint64_t k = 0; k < len; k++) byte_sum += data[k];
        }
        if (keep && nkept < 4096) kept[nkept++] = b;
        else gpufeed_batch_free(b);
    }
    while (nkept > 0) gpufeed_batch_free(kept[--nkept]);
    if (samples != gpufeed_loader_samples_per_epoch(l)) {
        fprintf(stderr, "%" PRIu64 " samples, expected %" PRIu64 "\n", samples,
                gpufeed_loader_samples_per_epoch(l));
        return 1;
    }
    gpufeed_loader_close(l);
    printf("samples %" PRIu64 " padding %" PRIu64 " batches %u bytes %" PRIu64 "\n", samples, padding,
           batches, byte_sum);
    return 0;
}
