/*
 * kvswap_kernel.cu.h - the copy kernel's CUDA source, as a C string.
 *
 * Compiled at run time (NVRTC, to machine code for the device's own architecture) by
 * kernel_path.h; the host library stays plain C built by gcc.  The same text is checked by
 * `nvcc -cubin` in the tests, so keep it free of host-only constructs.
 *
 * One CTA copies one block (gridDim.x = number of blocks; gridDim.y splits very large blocks).
 * Descriptors: srcs[n], dsts[n] (device-visible addresses: device memory, or pinned host
 * memory through its unified-addressing mapping) and sizes[n], or one `uniform_size` for all
 * blocks (sizes == NULL).  Blocks whose source, destination and size are all 16-byte aligned
 * move in 16-byte words, UNROLL words in flight per thread; 8-byte alignment uses 8-byte words;
 * anything else goes byte by byte.
 */
#ifndef KVSWAP_KERNEL_CU_H
#define KVSWAP_KERNEL_CU_H

#define KVSWAP_KERNEL_NAME "kvswap_copy_blocks"
#define KVSWAP_KERNEL_THREADS 256

static const char kvswap_kernel_source[] =
    "#define UNROLL 4\n"
    "typedef unsigned long long u64;\n"
    "extern \"C\" __global__ void __launch_bounds__(256)\n"
    "kvswap_copy_blocks(const u64 *__restrict__ srcs, const u64 *__restrict__ dsts,\n"
    "                   const u64 *__restrict__ sizes, u64 uniform_size) {\n"
    "    const u64 b = blockIdx.x;\n"
    "    const char *src = (const char *)srcs[b];\n"
    "    char *dst = (char *)dsts[b];\n"
    "    const u64 size = sizes ? sizes[b] : uniform_size;\n"
    "    /* gridDim.y CTAs share one block: each takes a contiguous, 16-byte-aligned slice. */\n"
    "    const u64 per = ((size + gridDim.y - 1) / gridDim.y + 15) & ~(u64)15;\n"
    "    const u64 lo = per * blockIdx.y;\n"
    "    if (lo >= size) return;\n"
    "    const u64 hi = lo + per < size ? lo + per : size;\n"
    "    const unsigned t = threadIdx.x, nt = blockDim.x;\n"
    "    const u64 align = (u64)src | (u64)dst | lo | hi;\n"
    "    if ((align & 15) == 0) {\n"
    "        const uint4 *s = (const uint4 *)(src + lo);\n"
    "        uint4 *d = (uint4 *)(dst + lo);\n"
    "        const u64 words = (hi - lo) >> 4;\n"
    "        u64 i = t;\n"
    "        for (; i + (UNROLL - 1) * (u64)nt < words; i += UNROLL * (u64)nt) {\n"
    "            uint4 v[UNROLL];\n"
    "#pragma unroll\n"
    "            for (int k = 0; k < UNROLL; k++) v[k] = s[i + k * (u64)nt];\n"
    "#pragma unroll\n"
    "            for (int k = 0; k < UNROLL; k++) d[i + k * (u64)nt] = v[k];\n"
    "        }\n"
    "        for (; i < words; i += nt) d[i] = s[i];\n"
    "    } else if ((align & 7) == 0) {\n"
    "        const u64 *s = (const u64 *)(src + lo);\n"
    "        u64 *d = (u64 *)(dst + lo);\n"
    "        const u64 words = (hi - lo) >> 3;\n"
    "        for (u64 i = t; i < words; i += nt) d[i] = s[i];\n"
    "    } else {\n"
    "        for (u64 i = lo + t; i < hi; i += nt) dst[i] = src[i];\n"
    "    }\n"
    "}\n";

#endif /* KVSWAP_KERNEL_CU_H */
