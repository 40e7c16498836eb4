/* Stops an epoch on W ranks after K batches each and resumes it on W2 ranks through gpufeed's C
 * ABI, printing every real (not padding) sample id delivered, for tests/it/capi.rs to check
 * that the two runs together deliver what the epoch owed, each sample once.
 * usage: resume DATASET ORDER LAST_BATCH W K W2 (ORDER and LAST_BATCH as gpufeed_options). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpufeed.h"

static int fail(const char* what, int32_t st) {
    fprintf(stderr, "%s: status %d: %s\n", what, (int)st, gpufeed_last_error());
    return 1;
}

/* Reads up to `most` batches of the started epoch, printing real sample ids; *read: batches. */
static int drain(gpufeed_loader* l, uint32_t most, uint32_t* read) {
    *read = 0;
    while (*read < most) {
        gpufeed_batch* b = NULL;
        int32_t st = gpufeed_loader_next(l, &b);
        if (st != GPUFEED_OK) return fail("next", st);
        if (b == NULL) break;
        for (uint32_t i = 0; i < gpufeed_batch_len(b); i++)
            if (!gpufeed_batch_is_padding(b, i)) printf("id %u\n", gpufeed_batch_sample_id(b, i));
        gpufeed_batch_free(b);
        (*read)++;
    }
    return 0;
}

static gpufeed_loader* open_rank(const char* path, uint32_t order, uint32_t last_batch, uint32_t rank,
                                 uint32_t world) {
    gpufeed_options o;
    gpufeed_options_default(&o);
    o.batch_size = 4;
    o.seed = 11;
    o.order = order;
    o.last_batch = (uint8_t)last_batch;
    o.rank = rank;
    o.world_size = world;
    o.block_bytes = 64 << 10;
    o.open_blocks = 2;
    o.shuffle_buffer = 16;
    gpufeed_loader* l = NULL;
    int32_t st = gpufeed_loader_open(path, &o, &l);
    if (st != GPUFEED_OK) {
        fail("open", st);
        return NULL;
    }
    return l;
}

int main(int argc, char** argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s DATASET ORDER LAST_BATCH W K W2\n", argv[0]);
        return 2;
    }
    const char* path = argv[1];
    uint32_t order = (uint32_t)atoi(argv[2]), last_batch = (uint32_t)atoi(argv[3]);
    uint32_t w = (uint32_t)atoi(argv[4]), k = (uint32_t)atoi(argv[5]), w2 = (uint32_t)atoi(argv[6]);
    const uint64_t epoch = 1;
    for (uint32_t r = 0; r < w; r++) {
        gpufeed_loader* l = open_rank(path, order, last_batch, r, w);
        if (!l) return 1;
        int32_t st = gpufeed_loader_start_epoch(l, epoch, 0);
        if (st != GPUFEED_OK) return fail("epoch", st);
        uint32_t read;
        if (drain(l, k, &read)) return 1;
        if (read != k) {
            fprintf(stderr, "rank %u of %u read %u batches before the stop at %u\n", r, w, read, k);
            return 1;
        }
        gpufeed_loader_close(l);
    }
    /* The stop, as the old ranks' state would carry it. */
    uint32_t worlds[1] = {w}, batches[1] = {k};
    uint32_t counts = 0;
    for (uint32_t r = 0; r < w2; r++) {
        gpufeed_loader* l = open_rank(path, order, last_batch, r, w2);
        if (!l) return 1;
        uint32_t want = 0;
        int32_t st = gpufeed_loader_resumed_batches(l, epoch, worlds, batches, 1, &want);
        if (st != GPUFEED_OK) return fail("resumed_batches", st);
        if ((st = gpufeed_loader_start_epoch_resumed(l, epoch, worlds, batches, 1, 0)) != GPUFEED_OK)
            return fail("start_epoch_resumed", st);
        uint32_t read;
        if (drain(l, UINT32_MAX, &read)) return 1;
        if (read != want) {
            fprintf(stderr, "rank %u of %u read %u batches, resumed_batches said %u\n", r, w2, read, want);
            return 1;
        }
        printf("rank %u batches %u\n", r, read);
        counts++;
        /* A stop past the epoch is an error that says so, not a crash. */
        uint32_t past[1] = {100000};
        st = gpufeed_loader_start_epoch_resumed(l, epoch, worlds, past, 1, 0);
        if (st == GPUFEED_OK) {
            fprintf(stderr, "a stop at batch 100000 was accepted\n");
            return 1;
        }
        if (gpufeed_loader_start_epoch_resumed(l, epoch, NULL, NULL, 1, 0) != GPUFEED_ERR_INVALID)
            return fail("null stops", -1);
        gpufeed_loader_close(l);
    }
    printf("resumed on %u ranks\n", counts);
    return 0;
}
