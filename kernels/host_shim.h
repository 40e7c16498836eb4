/* Runs gpufeed's kernels on the CPU: compile a kernel's .cu as C++ with this header included
 * first (`c++ -include kernels/host_shim.h -x c++ kernels/resize.cu ...`), then call
 * gf_launch with the grid and block sizes. The kernels use no shared memory and no
 * synchronisation, so running every thread in turn is exactly what the device computes, up to
 * floating-point contraction (pass -ffp-contract=off to keep the host's arithmetic plain). */
#ifndef GF_HOST_SHIM_H
#define GF_HOST_SHIM_H
#define GF_HOST 1
#define GF_DEVICE static inline
#define GF_GLOBAL static
#define GF_CONSTANT static const
#define GF_TABLE static const

struct gf_dim3 {
    unsigned int x, y, z;
};
/* One set per thread: the simulated device launches kernels from several threads at once. */
static thread_local gf_dim3 blockIdx, blockDim, threadIdx, gridDim;

/* Every block and thread in turn. */
#define gf_launch(grid_x, grid_y, block_x, call)                                               \
    do {                                                                                       \
        gridDim.x = (grid_x);                                                                  \
        gridDim.y = (grid_y);                                                                  \
        gridDim.z = 1;                                                                         \
        blockDim.x = (block_x);                                                                \
        blockDim.y = 1;                                                                        \
        blockDim.z = 1;                                                                        \
        for (blockIdx.y = 0; blockIdx.y < gridDim.y; blockIdx.y++)                             \
            for (blockIdx.x = 0; blockIdx.x < gridDim.x; blockIdx.x++)                         \
                for (threadIdx.x = 0; threadIdx.x < blockDim.x; threadIdx.x++) {               \
                    call;                                                                      \
                }                                                                              \
    } while (0)
#endif
