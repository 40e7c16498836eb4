/* The C door to the image settings' table, for tests/it/capi.rs: opens DIR, fills a
 * gpufeed_images with gpufeed_images_default, sets the fields given as KEY=VALUE (numbers;
 * mean and std as A,B,C), asks for decoded images and prints "images {json}" as
 * gpufeed_loader_image_settings gives it.
 * Usage: image_settings KEY=VALUE... -- DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpufeed.h"

static void three(const char* v, float out[3]) {
    char* end = NULL;
    for (int i = 0; i < 3; i++) {
        out[i] = strtof(v, &end);
        v = (*end == ',') ? end + 1 : end;
    }
}

int main(int argc, char** argv) {
    gpufeed_images spec;
    if (gpufeed_images_default(&spec) != GPUFEED_OK) return fprintf(stderr, "defaults\n"), 1;
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        char* eq = strchr(argv[i], '=');
        if (eq == NULL) return fprintf(stderr, "expected KEY=VALUE: %s\n", argv[i]), 2;
        *eq = '\0';
        const char* k = argv[i];
        const char* v = eq + 1;
        uint32_t n = (uint32_t)strtoul(v, NULL, 10);
        if (!strcmp(k, "transform")) spec.transform = n;
        else if (!strcmp(k, "size")) spec.size = n;
        else if (!strcmp(k, "dtype")) spec.dtype = n;
        else if (!strcmp(k, "layout")) spec.layout = n;
        else if (!strcmp(k, "mean")) three(v, spec.mean);
        else if (!strcmp(k, "std")) three(v, spec.std);
        else if (!strcmp(k, "threads")) spec.threads = n;
        else if (!strcmp(k, "resize")) spec.resize = n;
        else return fprintf(stderr, "unknown field %s\n", k), 2;
    }
    if (i != argc - 2) return fprintf(stderr, "usage: %s KEY=VALUE... -- DIR\n", argv[0]), 2;
    gpufeed_options o;
    gpufeed_options_default(&o);
    o.batch_size = 4;
    gpufeed_loader* l = NULL;
    if (gpufeed_loader_open(argv[argc - 1], &o, &l) != GPUFEED_OK) {
        fprintf(stderr, "open: %s\n", gpufeed_last_error());
        return 1;
    }
    if (strcmp(gpufeed_loader_image_settings(l), "") != 0) {
        fprintf(stderr, "image settings before decoding was asked for\n");
        return 1;
    }
    if (gpufeed_loader_decode_images(l, &spec) != GPUFEED_OK) {
        printf("refused %s\n", gpufeed_last_error());
        gpufeed_loader_close(l);
        return 0;
    }
    printf("images %s\n", gpufeed_loader_image_settings(l));
    gpufeed_loader_close(l);
    return 0;
}
