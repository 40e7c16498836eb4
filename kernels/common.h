/* Shared by gpufeed's kernels. The sources are plain C++ in the subset NVRTC and a host C++
 * compiler both accept: no CUDA headers (f16 and bf16 are written as bits), no shared memory,
 * no synchronisation, so `kernels/host_shim.h` can run the exact same source on the CPU
 * (tests compare it with the CPU decode stage). Embedded in the crate with include_str! and
 * compiled at run time by NVRTC for the device's architecture. */
#ifndef GF_COMMON_H
#define GF_COMMON_H

#ifndef GF_HOST
#define GF_DEVICE __device__ __forceinline__
#define GF_GLOBAL extern "C" __global__
#define GF_CONSTANT __constant__
/* A table read at data-dependent indices: global memory (cached), not constant memory. */
#define GF_TABLE __device__ const
#endif

typedef unsigned char gf_u8;
typedef unsigned short gf_u16;
typedef unsigned int gf_u32;
typedef unsigned long long gf_u64;

/* f32 -> IEEE half bits, round to nearest even (as Rust's half::f16::from_f32). */
GF_DEVICE gf_u16 gf_f32_to_f16(float f) {
    union { float f; gf_u32 u; } v;
    v.f = f;
    gf_u32 x = v.u;
    gf_u32 sign = (x >> 16) & 0x8000u;
    gf_u32 exp = (x >> 23) & 0xffu;
    gf_u32 man = x & 0x7fffffu;
    if (exp == 0xffu) { /* inf or NaN */
        return (gf_u16)(sign | 0x7c00u | (man ? (0x0200u | (man >> 13)) : 0u));
    }
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f) return (gf_u16)(sign | 0x7c00u); /* overflow: inf */
    if (e <= 0) { /* subnormal or zero */
        if (e < -10) return (gf_u16)sign;
        man |= 0x800000u;
        gf_u32 shift = (gf_u32)(14 - e);
        gf_u32 half_man = man >> shift;
        gf_u32 rem = man & ((1u << shift) - 1u);
        gf_u32 halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (half_man & 1u))) half_man++;
        return (gf_u16)(sign | half_man);
    }
    gf_u32 half_man = man >> 13;
    gf_u32 rem = man & 0x1fffu;
    gf_u32 out = sign | ((gf_u32)e << 10) | half_man;
    if (rem > 0x1000u || (rem == 0x1000u && (half_man & 1u))) out++; /* may carry into exp */
    return (gf_u16)out;
}

/* f32 -> bfloat16 bits, round to nearest even (NaN kept a NaN). */
GF_DEVICE gf_u16 gf_f32_to_bf16(float f) {
    union { float f; gf_u32 u; } v;
    v.f = f;
    gf_u32 x = v.u;
    if ((x & 0x7fffffffu) > 0x7f800000u) return (gf_u16)((x >> 16) | 0x40u);
    gf_u32 round = 0x7fffu + ((x >> 16) & 1u);
    return (gf_u16)((x + round) >> 16);
}

#endif
