/* Decoded images through the C ABI: open an ImageFolder, ask for the evaluation transform to
 * 32x32 float32 NCHW, read one epoch, and print what the DLPack tensors say. A truncated image
 * in the folder must come back as GPUFEED_ERR_SAMPLE naming its file, zero-filled. Asked for
 * while an epoch of compressed bytes is in progress, decoding starts with the next epoch: the
 * one in progress delivers every sample, undecoded ("raw N").
 * Usage: images DIR */
#include <stdio.h>
#include <string.h>

#include "gpufeed.h"

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    gpufeed_options o;
    gpufeed_options_default(&o);
    o.batch_size = 8;
    gpufeed_loader* l = NULL;
    if (gpufeed_loader_open(argv[1], &o, &l) != GPUFEED_OK) {
        fprintf(stderr, "open: %s\n", gpufeed_last_error());
        return 1;
    }
    /* A raw epoch in progress: one batch read before decoding is asked for, the rest after. */
    unsigned long raw = 0;
    if (gpufeed_loader_start_epoch(l, 0, 0) != GPUFEED_OK) {
        fprintf(stderr, "start: %s\n", gpufeed_last_error());
        return 1;
    }
    gpufeed_batch* first = NULL;
    if (gpufeed_loader_next(l, &first) != GPUFEED_OK || !first) {
        fprintf(stderr, "first raw batch: %s\n", gpufeed_last_error());
        return 1;
    }
    raw += gpufeed_batch_len(first);
    gpufeed_batch_free(first);
    gpufeed_images spec;
    gpufeed_images_default(&spec);
    spec.transform = 1;
    spec.size = 32;
    spec.threads = 2;
    spec.dtype = 7; /* invalid: refused with a message */
    if (gpufeed_loader_decode_images(l, &spec) != GPUFEED_ERR_INVALID) {
        fprintf(stderr, "a bad dtype was accepted\n");
        return 1;
    }
    printf("refused: %s\n", gpufeed_last_error());
    spec.dtype = 3;
    if (gpufeed_loader_decode_images(l, &spec) != GPUFEED_OK) {
        fprintf(stderr, "decode: %s\n", gpufeed_last_error());
        return 1;
    }
    for (;;) {
        gpufeed_batch* b = NULL;
        int32_t st = gpufeed_loader_next(l, &b);
        if (st != GPUFEED_OK && st != GPUFEED_ERR_SAMPLE) {
            fprintf(stderr, "raw next: %s\n", gpufeed_last_error());
            return 1;
        }
        if (!b) break;
        for (uint32_t i = 0; i < gpufeed_batch_len(b); i++) {
            const uint8_t* data;
            uint64_t len;
            /* Compressed bytes, not a 32x32x3 float image. */
            if (gpufeed_batch_sample(b, i, &data, &len) == GPUFEED_OK && len == 3 * 32 * 32 * 4) {
                fprintf(stderr, "a decoded image in the raw epoch\n");
                return 1;
            }
        }
        raw += gpufeed_batch_len(b);
        gpufeed_batch_free(b);
    }
    printf("raw %lu\n", raw);
    if (gpufeed_loader_start_epoch(l, 0, 0) != GPUFEED_OK) {
        fprintf(stderr, "decode: %s\n", gpufeed_last_error());
        return 1;
    }
    unsigned long samples = 0, bad = 0, zero_bad = 1;
    double sum = 0;
    for (;;) {
        gpufeed_batch* b = NULL;
        if (gpufeed_loader_next(l, &b) != GPUFEED_OK) {
            fprintf(stderr, "next: %s\n", gpufeed_last_error());
            return 1;
        }
        if (!b) break;
        uint32_t n = gpufeed_batch_len(b);
        DLManagedTensor* t = NULL;
        if (gpufeed_batch_to_dlpack(b, &t) != GPUFEED_OK) {
            fprintf(stderr, "dlpack: %s\n", gpufeed_last_error());
            return 1;
        }
        DLTensor* x = &t->dl_tensor;
        if (x->ndim != 4 || x->shape[0] != n || x->shape[1] != 3 || x->shape[2] != 32 ||
            x->shape[3] != 32 || x->dtype.code != 2 || x->dtype.bits != 32 ||
            x->strides[0] != 3 * 32 * 32 || x->strides[3] != 1 || x->device.device_type != 1) {
            fprintf(stderr, "unexpected tensor\n");
            return 1;
        }
        const float* px = (const float*)x->data;
        for (uint32_t i = 0; i < n; i++) {
            const uint8_t* data;
            uint64_t len;
            int32_t st = gpufeed_batch_sample(b, i, &data, &len);
            const float* img = px + (size_t)i * 3 * 32 * 32;
            if (st == GPUFEED_ERR_SAMPLE) {
                bad++;
                printf("bad %s\n", gpufeed_last_error());
                for (int k = 0; k < 3 * 32 * 32; k++)
                    if (img[k] != 0.0f) zero_bad = 0;
            } else if (st != GPUFEED_OK || len != 3 * 32 * 32 * 4 || (const void*)data != img) {
                fprintf(stderr, "sample %u: status %d len %llu\n", i, st, (unsigned long long)len);
                return 1;
            } else {
                for (int k = 0; k < 3 * 32 * 32; k++) sum += img[k];
            }
            samples++;
        }
        gpufeed_batch_free(b);
        t->deleter(t); /* the tensor outlived its batch handle */
    }
    gpufeed_stats st;
    if (gpufeed_loader_stats(l, &st) != GPUFEED_OK || st.samples != samples || st.batches == 0 ||
        st.consumer_wait_s < st.decode_s || st.decode_cpu_s <= 0.0) {
        fprintf(stderr, "stats: samples %llu decode %f cpu %f\n", (unsigned long long)st.samples,
                st.decode_s, st.decode_cpu_s);
        return 1;
    }
    gpufeed_loader_close(l);
    printf("samples %lu bad %lu zero %lu finite %d\n", samples, bad, zero_bad, sum == sum);
    return 0;
}
