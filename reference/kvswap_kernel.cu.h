/*
 * kvswap_kernel.cu.h - the copy kernel's CUDA source, as a C string.
 *
 * Compiled at run time (NVRTC, to machine code for the device's own architecture) by
 * kernel_path.c; the host library stays plain C built by gcc.  The same text is checked by
 * `nvcc -cubin` in the tests, so keep it free of host-only constructs.
 *
 * A persistent grid of warps: work item `it` is slice (it % slices) of block (it / slices), and
 * warp w takes items w, w + W, w + 2W, ... (W warps in the grid).  So the grid can be any size:
 * the whole GPU (the `kernel` path), or a few CTAs that leave the other SMs to a computation
 * running beside the swap (the `beside-compute` policy's SM budget).  Slicing large blocks keeps
 * every warp busy when there are few of them.
 * Descriptors: srcs[n], dsts[n] (device-visible addresses: device memory, or pinned host memory
 * through its unified-addressing mapping) and sizes[n], or one `uniform_size` for all blocks
 * (sizes == NULL), in device memory; or, for up to KVSWAP_PARAM_BLOCKS blocks of one size, in the
 * kernel's parameters (kvswap_copy_params).  A slice whose source, destination and bounds are all
 * 16-byte aligned moves in 16-byte words, UNROLL loads in flight per lane before the first store;
 * 8-byte alignment uses 8-byte words; anything else goes byte by byte.
 */
#ifndef KVSWAP_KERNEL_CU_H
#define KVSWAP_KERNEL_CU_H

#define KVSWAP_KERNEL_NAME "kvswap_copy_blocks"
#define KVSWAP_PARAMS_KERNEL_NAME "kvswap_copy_params"
/* Blocks whose descriptors fit the kernel's parameters: 24 + 16 * 2040 = 32664 bytes, under the
 * 32764 that CUDA 12.1+ allows on sm_70+ (4096 before).  Calls of up to this many blocks of one
 * size skip the descriptor upload. */
#define KVSWAP_PARAM_BLOCKS 2040
/* Threads per CTA: the whole-GPU grid uses 256 (8 CTAs fill an SM); a budgeted grid uses
 * KVSWAP_KERNEL_MAX_THREADS per CTA, so that each SM it takes carries as many loads as it can. */
#define KVSWAP_KERNEL_THREADS 256
#define KVSWAP_KERNEL_MAX_THREADS 1024

static const char kvswap_kernel_source[] =
    "#define UNROLL 8\n"
    "typedef unsigned long long u64;\n"
    /* One work item: slice `sl` of `slices` of one block, copied by the 32 lanes of a warp. */
    "__device__ __forceinline__ void kv_copy_item(const char *src, char *dst, u64 size, unsigned slices,\n"
    "                                             u64 sl, unsigned lane) {\n"
    "    /* Slices are contiguous and 16-byte aligned within the block. */\n"
    "    const u64 per = ((size + slices - 1) / slices + 15) & ~(u64)15;\n"
    "    const u64 lo = per * sl;\n"
    "    if (lo >= size) return;\n"
    "    const u64 hi = lo + per < size ? lo + per : size;\n"
    "    const u64 align = (u64)src | (u64)dst | lo | hi;\n"
    "    if ((align & 15) == 0) {\n"
    "        const uint4 *s = (const uint4 *)(src + lo);\n"
    "        uint4 *d = (uint4 *)(dst + lo);\n"
    "        const u64 words = (hi - lo) >> 4;\n"
    "        u64 i = lane;\n"
    "        for (; i + (UNROLL - 1) * 32u < words; i += UNROLL * 32u) {\n"
    "            uint4 v[UNROLL];\n"
    "#pragma unroll\n"
    "            for (int k = 0; k < UNROLL; k++) v[k] = s[i + k * 32u];\n"
    "#pragma unroll\n"
    "            for (int k = 0; k < UNROLL; k++) d[i + k * 32u] = v[k];\n"
    "        }\n"
    "        for (; i < words; i += 32u) d[i] = s[i];\n"
    "    } else if ((align & 7) == 0) {\n"
    "        const u64 *s = (const u64 *)(src + lo);\n"
    "        u64 *d = (u64 *)(dst + lo);\n"
    "        const u64 words = (hi - lo) >> 3;\n"
    "        for (u64 i = lane; i < words; i += 32u) d[i] = s[i];\n"
    "    } else {\n"
    "        for (u64 i = lo + lane; i < hi; i += 32u) dst[i] = src[i];\n"
    "    }\n"
    "}\n"
    "extern \"C\" __global__ void __launch_bounds__(1024)\n"
    "kvswap_copy_blocks(const u64 *__restrict__ srcs, const u64 *__restrict__ dsts,\n"
    "                   const u64 *__restrict__ sizes, u64 uniform_size, u64 n, unsigned slices) {\n"
    "    const unsigned lane = threadIdx.x & 31u;\n"
    "    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;\n"
    "    const u64 nwarps = ((u64)gridDim.x * blockDim.x) >> 5;\n"
    "    const u64 items = n * slices;\n"
    "    for (u64 it = warp; it < items; it += nwarps) {\n"
    "        const u64 b = slices == 1 ? it : it / slices;\n"
    "        kv_copy_item((const char *)srcs[b], (char *)dsts[b], sizes ? sizes[b] : uniform_size, slices,\n"
    "                     it - b * slices, lane);\n"
    "    }\n"
    "}\n"
    /* Descriptors in the kernel's parameters (compiled with -DKVSWAP_PARAM_BLOCKS=N where the
     * driver and NVRTC take parameters over 4 KiB: CUDA 12.1+, sm_70+): nothing to upload before
     * the launch.  __grid_constant__ keeps them in the parameter space, indexed in place. */
    "#ifdef KVSWAP_PARAM_BLOCKS\n"
    "struct kvswap_params { u64 n; u64 size; unsigned slices; unsigned pad; u64 addr[2 * KVSWAP_PARAM_BLOCKS]; };\n"
    "extern \"C\" __global__ void __launch_bounds__(1024)\n"
    "kvswap_copy_params(const __grid_constant__ kvswap_params p) {\n"
    "    const unsigned lane = threadIdx.x & 31u;\n"
    "    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;\n"
    "    const u64 nwarps = ((u64)gridDim.x * blockDim.x) >> 5;\n"
    "    const u64 items = p.n * p.slices;\n"
    "    for (u64 it = warp; it < items; it += nwarps) {\n"
    "        const u64 b = p.slices == 1 ? it : it / p.slices;\n"
    "        kv_copy_item((const char *)p.addr[b], (char *)p.addr[KVSWAP_PARAM_BLOCKS + b], p.size, p.slices,\n"
    "                     it - b * p.slices, lane);\n"
    "    }\n"
    "}\n"
    "#endif\n";

#endif /* KVSWAP_KERNEL_CU_H */
