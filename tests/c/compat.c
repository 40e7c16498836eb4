/* Built by tests/it/capi.rs against another header than the library's: an older one (the last
 * field of each struct missing) or a newer one (a field appended to gpufeed_options,
 * `future`, defined by -DFUTURE). The library must write no byte past the program's structs
 * (canaries after each), keep its defaults for what the program does not know, and refuse a
 * newer field that is set (argv[2] "set"), and a struct_size that ends inside a field or is
 * no struct's ("partial", "huge"). Prints what it saw for the test to check. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "gpufeed.h"

#define CANARY 0x5AFEC0DE5AFEC0DEull

static int fail(const char* what, int32_t st) {
    fprintf(stderr, "%s: status %d: %s\n", what, (int)st, gpufeed_last_error());
    return 1;
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DATASET [set]\n", argv[0]);
        return 2;
    }
    struct {
        gpufeed_options o;
        uint64_t canary;
    } wo;
    memset(&wo, 0xEE, sizeof wo);
    wo.canary = CANARY;
    int32_t st = gpufeed_options_default(&wo.o);
    if (st != GPUFEED_OK) return fail("options default", st);
    if (wo.canary != CANARY) {
        fprintf(stderr, "gpufeed_options_default wrote past the program's struct\n");
        return 1;
    }
    if (wo.o.struct_size != sizeof(gpufeed_options)) {
        fprintf(stderr, "struct_size %u, sizeof %u\n", wo.o.struct_size,
                (unsigned)sizeof(gpufeed_options));
        return 1;
    }
    wo.o.batch_size = 4;
    /* A size that ends inside a field, and one no struct has: refused, not read. */
    if (argc > 2 && strcmp(argv[2], "partial") == 0) wo.o.struct_size = 101;
    if (argc > 2 && strcmp(argv[2], "huge") == 0) wo.o.struct_size = 0xdeadbeefu;
#ifdef FUTURE
    if (wo.o.future != 0) {
        fprintf(stderr, "the library did not zero the field it does not know\n");
        return 1;
    }
    if (argc > 2 && strcmp(argv[2], "set") == 0) wo.o.future = 7;
#endif
    gpufeed_loader* l = NULL;
    st = gpufeed_loader_open(argv[1], &wo.o, &l);
    if (st != GPUFEED_OK) {
        printf("open status %d: %s\n", (int)st, gpufeed_last_error());
        return 0;
    }
    printf("dataset options %s\n", gpufeed_loader_dataset_options(l));
    if ((st = gpufeed_loader_start_epoch(l, 0, 0)) != GPUFEED_OK) return fail("epoch", st);
    uint64_t samples = 0;
    for (;;) {
        gpufeed_batch* b = NULL;
        if ((st = gpufeed_loader_next(l, &b)) != GPUFEED_OK) return fail("next", st);
        if (b == NULL) break;
        samples += gpufeed_batch_len(b);
        gpufeed_batch_free(b);
    }
    struct {
        gpufeed_stats s;
        uint64_t canary;
    } ws;
    memset(&ws, 0xEE, sizeof ws);
    ws.canary = CANARY;
    if ((st = gpufeed_loader_stats(l, &ws.s)) != GPUFEED_OK) return fail("stats", st);
    if (ws.canary != CANARY || ws.s.struct_size != sizeof(gpufeed_stats)) {
        fprintf(stderr, "gpufeed_loader_stats wrote past the program's struct\n");
        return 1;
    }
    struct {
        gpufeed_images i;
        uint64_t canary;
    } wi;
    memset(&wi, 0xEE, sizeof wi);
    wi.canary = CANARY;
    if ((st = gpufeed_images_default(&wi.i)) != GPUFEED_OK) return fail("images default", st);
    if (wi.canary != CANARY || wi.i.size != 224) {
        fprintf(stderr, "gpufeed_images_default wrote past the program's struct\n");
        return 1;
    }
    printf("samples %" PRIu64 " stats %" PRIu64 " batches %" PRIu64 "\n", samples, ws.s.samples,
           ws.s.batches);
    gpufeed_loader_close(l);
    return 0;
}
