/*
 * driver_api.h - what driver_api.inc shares with the other translation unit of a driver-family
 * library (kernel_path.c): the resolved driver entry points and the copy helpers built on them.
 * Every symbol here is hidden (KV_HIDDEN): shared inside one library, never exported by it.
 */
#ifndef KV_DRIVER_API_H
#define KV_DRIVER_API_H

#include <stddef.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "kvswap_internal.h"

_Static_assert(sizeof(CUdeviceptr) == sizeof(void *), "CUdeviceptr must hold a pointer");

/* CUmemcpyAttributes as the 12.8 ABI lays it out, for headers older than 12.8 that lack the type:
 * (CUmemcpySrcAccessOrder, CUmemLocation src hint, CUmemLocation dst hint, unsigned flags). */
typedef struct {
    int srcAccessOrder; /* CUmemcpySrcAccessOrder */
    struct { int type; int id; } srcLocHint, dstLocHint; /* CUmemLocation */
    unsigned int flags;
} kv_cu_attrs_spelt;

/* The 9-parameter ABI cuGetProcAddress hands out when asked for version 12080: it ends in
 * (size_t *failIdx, CUstream).  CUDA 13 headers #define the name to the 8-parameter _v2, so
 * the type is the headers' versioned typedef, or spelt out where the headers predate it. */
#if CUDA_VERSION >= 12080
typedef CUmemcpyAttributes kv_cu_attrs;
typedef PFN_cuMemcpyBatchAsync_v12080 kv_cu_batch_fn;
/* The spelt-out layout, used with older headers, checked against the real one wherever it exists. */
_Static_assert(sizeof(kv_cu_attrs_spelt) == sizeof(CUmemcpyAttributes), "CUmemcpyAttributes size");
_Static_assert(offsetof(kv_cu_attrs_spelt, srcAccessOrder) == offsetof(CUmemcpyAttributes, srcAccessOrder),
               "CUmemcpyAttributes.srcAccessOrder offset");
_Static_assert(offsetof(kv_cu_attrs_spelt, srcLocHint) == offsetof(CUmemcpyAttributes, srcLocHint),
               "CUmemcpyAttributes.srcLocHint offset");
_Static_assert(offsetof(kv_cu_attrs_spelt, dstLocHint) == offsetof(CUmemcpyAttributes, dstLocHint),
               "CUmemcpyAttributes.dstLocHint offset");
_Static_assert(offsetof(kv_cu_attrs_spelt, flags) == offsetof(CUmemcpyAttributes, flags),
               "CUmemcpyAttributes.flags offset");
_Static_assert(sizeof(((kv_cu_attrs_spelt *)0)->srcLocHint) == sizeof(CUmemLocation), "CUmemLocation size");
_Static_assert(offsetof(CUmemLocation, id) == sizeof(int), "CUmemLocation.id offset");
_Static_assert(sizeof(CUmemcpySrcAccessOrder) == sizeof(int), "CUmemcpySrcAccessOrder is an int-sized enum");
#else
typedef kv_cu_attrs_spelt kv_cu_attrs;
typedef CUresult (*kv_cu_batch_fn)(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                   kv_cu_attrs *attrs, size_t *attrIdxs, size_t numAttrs, size_t *failIdx,
                                   CUstream hStream);
#endif
#define KV_CU_SRC_ACCESS_ORDER_STREAM 1 /* CU_MEMCPY_SRC_ACCESS_ORDER_STREAM */
#if CUDA_VERSION >= 12080
_Static_assert(KV_CU_SRC_ACCESS_ORDER_STREAM == CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, "CU_MEMCPY_SRC_ACCESS_ORDER_STREAM");
#endif
#define KV_CU_BATCH_ABI_VERSION 12080

typedef CUresult (*kv_cu_gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*kv_cu_gpa_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*kv_cu_memcpy_async_fn)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef CUresult (*kv_cu_error_name_fn)(CUresult, const char **);

/* Each spelt-out entry-point type is the one the headers give for the version it is asked for. */
#define KV_SAME_TYPE(ours, theirs) \
    _Static_assert(__builtin_types_compatible_p(ours, theirs), #ours " differs from the headers' " #theirs)
KV_SAME_TYPE(kv_cu_gpa_v2_fn, PFN_cuGetProcAddress_v12000);
KV_SAME_TYPE(kv_cu_gpa_v1_fn, PFN_cuGetProcAddress_v11030);
KV_SAME_TYPE(kv_cu_memcpy_async_fn, PFN_cuMemcpyAsync_v4000);
KV_SAME_TYPE(kv_cu_error_name_fn, PFN_cuGetErrorName_v6000);

typedef struct {
    int code; /* 0, or KVSWAP_E_* when resolution failed */
    char message[200];
    kv_cu_gpa_v2_fn gpa2; /* kept for entry points resolved later (kernel_path.c) */
    kv_cu_gpa_v1_fn gpa1;
    kv_cu_memcpy_async_fn memcpy_async;
    kv_cu_batch_fn batch; /* NULL: the driver has no 12.8 batch entry -> fallback */
    kv_cu_error_name_fn error_name;
} kv_drv_state;

/* Written once, by the resolution (pthread_once in kv_drv_swap, driver_family.inc); read after it. */
extern KV_HIDDEN kv_drv_state kv_drv;

/* An entry point from cuGetProcAddress at `version`, or NULL. */
KV_HIDDEN void *kv_drv_lookup(const char *name, int version);
/* CUDA's name of a CUresult ("unknown CUresult" when the driver cannot say). */
KV_HIDDEN const char *kv_drv_error_name(CUresult rc);
/* The batch of [first, first + count) in calls of at most min(kv_chunk(), `chunk`) descriptors
 * (0: kv_chunk()), all on `stream`; `flags` is CUmemcpyAttributes.flags. */
KV_HIDDEN int kv_drv_batch_chunked(void *const *src, void *const *dst, const size_t *sizes, size_t first, size_t count,
                                   size_t chunk, unsigned flags, CUstream stream, kvswap_status *st);

#endif /* KV_DRIVER_API_H */
