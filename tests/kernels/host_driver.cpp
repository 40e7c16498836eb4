// Runs gpufeed's kernels on the CPU through kernels/host_shim.h: the exact .cu sources the GPU
// runs. Built by tests/it/kernels.rs with
//   c++ -O1 -ffp-contract=off -include kernels/host_shim.h -I kernels host_driver.cpp
// Modes (binary files, little endian, the #[repr(C)] structs of src/gpu/kernels.rs):
//   resize IN OUT  IN: u32 n, u64 src_len, gf_emit, n gf_sample, src bytes; OUT: the tensor
//   crc IN OUT     IN: u32 n, u64 data_len, n gf_span, data; OUT: n u32
//   half IN OUT    IN: f32 values; OUT: f16 bits of each, then bf16 bits of each (u16)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "resize.cu"
#include "crc32c.cu"

static std::vector<unsigned char> slurp(const char* path) {
    std::vector<unsigned char> v;
    FILE* f = std::fopen(path, "rb");
    if (!f) { std::perror(path); std::exit(2); }
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + n);
    std::fclose(f);
    return v;
}

static void spit(const char* path, const void* p, size_t n) {
    FILE* f = std::fopen(path, "wb");
    if (!f || std::fwrite(p, 1, n, f) != n) { std::perror(path); std::exit(2); }
    std::fclose(f);
}

template <class T> static T take(const std::vector<unsigned char>& v, size_t& at) {
    T x;
    if (at + sizeof(T) > v.size()) { std::fprintf(stderr, "input too short\n"); std::exit(2); }
    std::memcpy(&x, v.data() + at, sizeof(T));
    at += sizeof(T);
    return x;
}

int main(int argc, char** argv) {
    if (argc != 4) { std::fprintf(stderr, "usage: %s resize|crc|half IN OUT\n", argv[0]); return 2; }
    std::vector<unsigned char> in = slurp(argv[2]);
    size_t at = 0;
    if (!std::strcmp(argv[1], "resize")) {
        gf_u32 n = take<gf_u32>(in, at);
        gf_u64 src_len = take<gf_u64>(in, at);
        gf_emit e = take<gf_emit>(in, at);
        std::vector<gf_sample> s(n);
        for (gf_u32 i = 0; i < n; i++) s[i] = take<gf_sample>(in, at);
        if (at + src_len != in.size()) { std::fprintf(stderr, "bad source length\n"); return 2; }
        const gf_u8* src = in.data() + at;
        size_t size = e.dtype == 0 ? 1 : (e.dtype == 3 ? 4 : 2);
        std::vector<gf_u8> out((size_t)n * 3 * e.out_w * e.out_h * size, 0xAB);
        gf_u32 block = 128, pixels = e.out_w * e.out_h;
        gf_launch((pixels + block - 1) / block, n, block, gf_resize(src, s.data(), e, out.data()));
        spit(argv[3], out.data(), out.size());
    } else if (!std::strcmp(argv[1], "crc")) {
        gf_u32 n = take<gf_u32>(in, at);
        gf_u64 len = take<gf_u64>(in, at);
        std::vector<gf_span> s(n);
        for (gf_u32 i = 0; i < n; i++) s[i] = take<gf_span>(in, at);
        if (at + len != in.size()) { std::fprintf(stderr, "bad data length\n"); return 2; }
        std::vector<gf_u32> out(n, 0), lanes((size_t)n * GF_CRC_LANES, 0);
        gf_launch(n, 1, GF_CRC_LANES, gf_crc32c(in.data() + at, s.data(), n, lanes.data()));
        gf_launch((n + 63) / 64, 1, 64, gf_crc32c_combine(s.data(), n, lanes.data(), out.data()));
        spit(argv[3], out.data(), out.size() * 4);
    } else if (!std::strcmp(argv[1], "half")) {
        size_t n = in.size() / 4;
        std::vector<gf_u16> out(2 * n);
        for (size_t i = 0; i < n; i++) {
            float f;
            std::memcpy(&f, in.data() + 4 * i, 4);
            out[i] = gf_f32_to_f16(f);
            out[n + i] = gf_f32_to_bf16(f);
        }
        spit(argv[3], out.data(), out.size() * 2);
    } else {
        std::fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    return 0;
}
