/* The fused transform: every sample of a batch in one launch. For each output pixel: the
 * antialiased bilinear filter Pillow uses (a triangle widened by the downscale factor, weights
 * normalised), over the sample's own box of its decoded RGB image, then mirror, normalise, cast
 * and lay out into the batch tensor. The CPU twin is src/decode/resample.rs; the geometry (box,
 * window, flip) is computed on the CPU from (seed, epoch, sample id) by the same code for both.
 *
 * Launch: grid (ceil(out_w * out_h / blockDim.x), samples), any block size. */
#include "common.h"

/* One sample: where its decoded image is and what to make of it. 64 bytes, as gpu::kernels
 * GfSample (#[repr(C)]). */
struct gf_sample {
    gf_u64 src;       /* byte offset of the image (packed RGB, 8 bits) in the source buffer */
    gf_u32 src_w;     /* its width and height in pixels */
    gf_u32 src_h;
    gf_u32 src_pitch; /* bytes per row */
    gf_u32 full_w;    /* the box is resized to full_w x full_h ... */
    gf_u32 full_h;
    gf_u32 win_x;     /* ... of which the window at (win_x, win_y) of the output's size is kept */
    gf_u32 win_y;
    gf_u32 flip;      /* nonzero: mirror left-right */
    float box[4];     /* left, top, right, bottom in source pixels */
    gf_u32 valid;     /* 0: the sample failed; write zeros */
    gf_u32 reserved;
};

/* The output: size, element type (0 u8, 1 f16, 2 bf16, 3 f32), layout (0 NCHW, 1 NHWC), and
 * per-channel normalisation v * scale + bias on the 0-255 scale (float types). 40 bytes, as
 * gpu::kernels GfEmit. */
struct gf_emit {
    gf_u32 out_w;
    gf_u32 out_h;
    gf_u32 dtype;
    gf_u32 layout;
    float scale[3];
    float bias[3];
};

/* One axis of Pillow's precompute_coeffs for output index `o` of the full resize: the first
 * source index, the tap count and what the weights need. */
struct gf_axis {
    int first;
    int count;
    float center;
    float ss;
};

GF_DEVICE gf_axis gf_axis_at(float in0, float in1, gf_u32 in_size, gf_u32 out_size, gf_u32 o) {
    float scale = (in1 - in0) / (float)out_size;
    float filterscale = scale > 1.0f ? scale : 1.0f;
    float support = filterscale;
    gf_axis a;
    a.center = in0 + ((float)o + 0.5f) * scale;
    a.ss = 1.0f / filterscale;
    int lo = (int)(a.center - support + 0.5f);
    if (lo < 0) lo = 0;
    int hi = (int)(a.center + support + 0.5f);
    if (hi > (int)in_size) hi = (int)in_size;
    a.first = lo;
    a.count = hi - lo > 0 ? hi - lo : 0;
    return a;
}

GF_DEVICE float gf_tap(const gf_axis* a, int k) {
    float d = ((float)(k + a->first) - a->center + 0.5f) * a->ss;
    d = d < 0.0f ? -d : d;
    return d < 1.0f ? 1.0f - d : 0.0f;
}

GF_DEVICE void gf_store(gf_u8* out, const gf_emit* e, gf_u64 idx, int c, float v) {
    v = v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v);
    switch (e->dtype) {
    case 0:
        out[idx] = (gf_u8)(v + 0.5f);
        break;
    case 1: {
        gf_u16 h = gf_f32_to_f16(v * e->scale[c] + e->bias[c]);
        out[idx * 2] = (gf_u8)(h & 0xffu);
        out[idx * 2 + 1] = (gf_u8)(h >> 8);
        break;
    }
    case 2: {
        gf_u16 h = gf_f32_to_bf16(v * e->scale[c] + e->bias[c]);
        out[idx * 2] = (gf_u8)(h & 0xffu);
        out[idx * 2 + 1] = (gf_u8)(h >> 8);
        break;
    }
    default: {
        union { float f; gf_u32 u; } w;
        w.f = v * e->scale[c] + e->bias[c];
        out[idx * 4] = (gf_u8)(w.u & 0xffu);
        out[idx * 4 + 1] = (gf_u8)((w.u >> 8) & 0xffu);
        out[idx * 4 + 2] = (gf_u8)((w.u >> 16) & 0xffu);
        out[idx * 4 + 3] = (gf_u8)(w.u >> 24);
        break;
    }
    }
}

GF_GLOBAL void gf_resize(const gf_u8* src, const gf_sample* samples, gf_emit e, gf_u8* out) {
    gf_u32 n = blockIdx.y;
    gf_u32 p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= e.out_w * e.out_h) return;
    gf_u32 x = p % e.out_w, y = p / e.out_w;
    const gf_sample s = samples[n];
    float acc[3] = {0.0f, 0.0f, 0.0f};
    /* Outside the resized image (a window larger than it), or a failed sample: zeros. */
    bool inside = s.valid && x + s.win_x < s.full_w && y + s.win_y < s.full_h;
    if (inside) {
        gf_axis ax = gf_axis_at(s.box[0], s.box[2], s.src_w, s.full_w, x + s.win_x);
        gf_axis ay = gf_axis_at(s.box[1], s.box[3], s.src_h, s.full_h, y + s.win_y);
        float wsx = 0.0f, wsy = 0.0f;
        for (int k = 0; k < ax.count; k++) wsx += gf_tap(&ax, k);
        for (int k = 0; k < ay.count; k++) wsy += gf_tap(&ay, k);
        const gf_u8* img = src + s.src;
        for (int j = 0; j < ay.count; j++) {
            float wy = gf_tap(&ay, j);
            if (wy == 0.0f) continue;
            const gf_u8* row = img + (gf_u64)(ay.first + j) * s.src_pitch + (gf_u64)ax.first * 3u;
            float r0 = 0.0f, r1 = 0.0f, r2 = 0.0f;
            for (int k = 0; k < ax.count; k++) {
                float wx = gf_tap(&ax, k);
                r0 += wx * (float)row[k * 3];
                r1 += wx * (float)row[k * 3 + 1];
                r2 += wx * (float)row[k * 3 + 2];
            }
            acc[0] += wy * r0;
            acc[1] += wy * r1;
            acc[2] += wy * r2;
        }
        float norm = (wsx != 0.0f && wsy != 0.0f) ? 1.0f / (wsx * wsy) : 0.0f;
        acc[0] *= norm;
        acc[1] *= norm;
        acc[2] *= norm;
    }
    /* Mirrored within the covered width, as the CPU pass does. */
    gf_u32 cw = s.full_w > s.win_x ? s.full_w - s.win_x : 0u;
    cw = cw < e.out_w ? cw : e.out_w;
    gf_u32 xo = (s.flip && x < cw) ? cw - 1u - x : x;
    for (int c = 0; c < 3; c++) {
        gf_u64 idx = e.layout == 0
            ? (((gf_u64)n * 3u + (gf_u64)c) * e.out_h + y) * e.out_w + xo
            : (((gf_u64)n * e.out_h + y) * e.out_w + xo) * 3u + (gf_u64)c;
        if (inside) {
            gf_store(out, &e, idx, c, acc[c]);
        } else {
            /* zero bytes, whatever the type */
            gf_u32 size = e.dtype == 0 ? 1u : (e.dtype == 3 ? 4u : 2u);
            for (gf_u32 b = 0; b < size; b++) out[idx * size + b] = 0;
        }
    }
}
