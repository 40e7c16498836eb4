/* Reads one epoch of a dataset through gpufeed's C ABI and prints what it saw, for
 * tests/it/capi.rs to check: samples, bad samples, the sum of all bytes and of all labels. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "gpufeed.h"

static int fail(const char* what, int32_t st) {
    fprintf(stderr, "%s: status %d: %s\n", what, (int)st, gpufeed_last_error());
    return 1;
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DATASET\n", argv[0]);
        return 2;
    }
    /* A missing dataset is an error with a message, not a crash. */
    gpufeed_loader* none = NULL;
    int32_t st = gpufeed_loader_open("/nonexistent/gpufeed-dataset", NULL, &none);
    if (st == GPUFEED_OK || none != NULL || strstr(gpufeed_last_error(), "nonexistent") == NULL) {
        fprintf(stderr, "opening a missing dataset: status %d, message '%s'\n", (int)st,
                gpufeed_last_error());
        return 1;
    }
    if (gpufeed_loader_next(NULL, NULL) != GPUFEED_ERR_INVALID) return fail("null handle", -1);

    gpufeed_options o;
    gpufeed_options_default(&o);
    o.batch_size = 8;
    o.seed = 5;
    gpufeed_loader* l = NULL;
    if ((st = gpufeed_loader_open(argv[1], &o, &l)) != GPUFEED_OK) return fail("open", st);
    if ((st = gpufeed_loader_start_epoch(l, 0, 0)) != GPUFEED_OK) return fail("epoch", st);

    uint64_t samples = 0, bad = 0, byte_sum = 0;
    int64_t label_sum = 0;
    uint32_t batches = 0;
    DLManagedTensor* kept = NULL;
    for (;;) {
        gpufeed_batch* b = NULL;
        if ((st = gpufeed_loader_next(l, &b)) != GPUFEED_OK) return fail("next", st);
        if (b == NULL) break;
        batches++;
        for (uint32_t i = 0; i < gpufeed_batch_len(b); i++) {
            const uint8_t* data;
            uint64_t len;
            st = gpufeed_batch_sample(b, i, &data, &len);
            samples++;
            if (st == GPUFEED_ERR_SAMPLE) {
                bad++;
                printf("bad %s\n", gpufeed_last_error());
                continue;
            }
            if (st != GPUFEED_OK) return fail("sample", st);
            for (uint64_t k = 0; k < len; k++) byte_sum += data[k];
            label_sum += gpufeed_batch_label(b, i);
        }
        /* The first batch's memory, exported as DLPack, outlives its batch handle. */
        if (kept == NULL) {
            if ((st = gpufeed_batch_to_dlpack(b, &kept)) != GPUFEED_OK) return fail("dlpack", st);
            uint64_t off, len;
            const uint8_t* data;
            if (gpufeed_batch_sample_range(b, 0, &off, &len) == GPUFEED_OK &&
                gpufeed_batch_sample(b, 0, &data, &len) == GPUFEED_OK) {
                const uint8_t* base = (const uint8_t*)kept->dl_tensor.data;
                if (base + off != data || kept->dl_tensor.device.device_type != 1 ||
                    kept->dl_tensor.dtype.bits != 8 || kept->dl_tensor.shape[0] < (int64_t)(off + len)) {
                    fprintf(stderr, "dlpack tensor does not view the batch's memory\n");
                    return 1;
                }
            }
        }
        gpufeed_batch_free(b);
    }
    if (batches != gpufeed_loader_batches(l)) {
        fprintf(stderr, "%u batches, expected %u\n", batches, gpufeed_loader_batches(l));
        return 1;
    }
    gpufeed_loader_close(l);
    if (kept) kept->deleter(kept);
    printf("samples %" PRIu64 " bad %" PRIu64 " bytes %" PRIu64 " labels %" PRId64 "\n", samples, bad,
           byte_sum, label_sum);
    return 0;
}
