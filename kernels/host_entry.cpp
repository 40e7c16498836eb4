// The kernels built for the host, as the simulated device launches them (cargo feature `sim`;
// build.rs compiles this file with `-include host_shim.h -ffp-contract=off`): the exact .cu
// sources the GPU runs, each launched over its whole grid, one thread after another. The
// callers (src/gpu/host_kernels.rs) check every bound before they call.
#include "resize.cu"
#include "crc32c.cu"

extern "C" void gf_host_resize(gf_u32 grid_x, gf_u32 grid_y, gf_u32 block_x, const gf_u8* src,
                               const gf_sample* samples, const gf_emit* e, gf_u8* out) {
    gf_launch(grid_x, grid_y, block_x, gf_resize(src, samples, *e, out));
}

extern "C" void gf_host_crc32c(const gf_u8* data, const gf_span* spans, gf_u32 n,
                               gf_u32* lanes, gf_u32* out) {
    gf_launch(n, 1, GF_CRC_LANES, gf_crc32c(data, spans, n, lanes));
    gf_launch((n + 63) / 64, 1, 64, gf_crc32c_combine(spans, n, lanes, out));
}
