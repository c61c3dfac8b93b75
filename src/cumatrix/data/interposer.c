/* An emulated CUDA driver: a libcuda.so.1 that forwards to the real driver but looks older.
 *
 * cumatrix compiles this file once per emulated version and real driver, with
 * -DCUMATRIX_TABLES='"tables.h"' naming a generated header that defines:
 *
 *   EMULATED_VERSION          the version cuDriverGetVersion answers (12040 for 12.4)
 *   REAL_PATH                 the real libcuda.so.1, as a string literal (used where the cell
 *                             has no PRIVATE_DRIVER_PATH, below: no mount namespace of its own)
 *   HAS_GET_PROC_ADDRESS      1 when the real driver exports cuGetProcAddress
 *   HAS_GET_PROC_ADDRESS_V2   1 when it exports cuGetProcAddress_v2
 *   N_FORWARDED               the number of forwarded exports
 *   FORWARDED(X)              X(name, index) for each export forwarded unchanged
 *   HIDDEN(X)                 X("base") for each cuGetProcAddress name introduced after
 *                             EMULATED_VERSION
 *   PTX_CEILING               the newest PTX ISA the emulated driver's JIT compiles, as
 *                             major * 100 + minor (807 for 8.7; 0: no ceiling), from
 *                             cumatrix/data/ptx_isa.json
 *   HAS_<entry point>         1 for each load or link entry point the real driver exports and
 *                             the emulated one keeps (cuModuleLoadData, cuLinkAddData_v2, ...):
 *                             those are this file's own, checked against PTX_CEILING
 *
 * Exports introduced after EMULATED_VERSION are simply not defined here, so a binary that
 * links one directly fails to load exactly as on an older driver (docs/facts.md section 4).
 * PTX handed to a load or link entry point (directly, or as the only code a fat binary has
 * for the device) whose .version is newer than PTX_CEILING is refused with
 * CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222) without calling the real driver, whose newer JIT
 * would compile it (docs/facts.md section 12).
 * Without CUMATRIX_TABLES the file compiles as it stands (an emulated 12.0 forwarding
 * nothing), so it can be read and checked as C.  x86-64 only (the trampolines).
 *
 * Built with -DCUMATRIX_RUNTIME_CONFIG instead, it is the prebuilt interposer a platform wheel
 * carries for hosts without a compiler: the same code, with the tables above read at run time
 * from a block cumatrix writes into each per-host copy (see that block below).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(CUMATRIX_RUNTIME_CONFIG)
/* The prebuilt variant (a platform wheel's cumatrix/libexec/libcumatrix_cuda.so): one build
 * for every host and emulated version.  It defines a trampoline for every entry point in
 * driver_entry_points.h, each resolved by dlsym on the real driver, and reads what the
 * generated header would fix from the block below, which cumatrix writes into each per-host
 * copy (finding it by its magic in .data); the exports this copy must not have (introduced
 * after the emulated version, or absent from the real driver) are made local in that copy's
 * .dynsym, and the dynamic linker and dlsym skip local symbols (glibc elf/dl-lookup.c,
 * do_lookup_x: "Local symbols are ignored"), so they fail to link exactly as missing ones do. */
#include <stddef.h>
#include "driver_entry_points.h"
#define CONFIG_MAGIC "cumatrix-interposer-config-v1"
#define CONFIG_PATH_BYTES 4096
#define CONFIG_HIDDEN_BYTES 32768
struct cumatrix_config {
    char magic[32];
    int32_t emulated_version; /* EMULATED_VERSION */
    int32_t ptx_ceiling;      /* PTX_CEILING */
    int32_t has_gpa;          /* the real driver exports cuGetProcAddress */
    int32_t has_gpa_v2;       /* ... and cuGetProcAddress_v2 */
    char real_path[CONFIG_PATH_BYTES];
    char hidden[CONFIG_HIDDEN_BYTES]; /* HIDDEN: NUL-terminated base names, then an empty one */
};
/* The layout cumatrix.provision.prebuilt_driver writes. */
_Static_assert(offsetof(struct cumatrix_config, emulated_version) == 32, "config layout");
_Static_assert(offsetof(struct cumatrix_config, real_path) == 48, "config layout");
_Static_assert(offsetof(struct cumatrix_config, hidden) == 48 + CONFIG_PATH_BYTES, "config layout");
/* Not static, not const: written into the file after the build, so never folded. */
__attribute__((visibility("hidden"), used)) struct cumatrix_config cumatrix_config = {
    CONFIG_MAGIC, 12000, 0, 1, 1, "", ""};
#define EMULATED_VERSION (cumatrix_config.emulated_version)
#define REAL_PATH (cumatrix_config.real_path)
#define PTX_CEILING (cumatrix_config.ptx_ceiling)
#define HAS_GET_PROC_ADDRESS 1
#define HAS_GET_PROC_ADDRESS_V2 1
#define GPA_EXPORTED (cumatrix_config.has_gpa)
#define GPA_V2_EXPORTED (cumatrix_config.has_gpa_v2)
#define N_FORWARDED 0
#define FORWARDED(X)
#define HIDDEN(X)
#elif defined(CUMATRIX_TABLES)
#include CUMATRIX_TABLES
#define LOADERS_FROM_TABLES 1  /* HAS_cu*: those loaders the real driver exports */
#else
#define EMULATED_VERSION 12000
#define REAL_PATH "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
#define HAS_GET_PROC_ADDRESS 1
#define HAS_GET_PROC_ADDRESS_V2 1
#define N_FORWARDED 0
#define FORWARDED(X)
#define HIDDEN(X)
#define PTX_CEILING 800
#endif

#ifndef LOADERS_FROM_TABLES
/* Prebuilt (configured after the build) or built without tables: every loader entry point. */
#define HAS_cuModuleLoad 1
#define HAS_cuModuleLoadData 1
#define HAS_cuModuleLoadDataEx 1
#define HAS_cuModuleLoadFatBinary 1
#define HAS_cuLibraryLoadData 1
#define HAS_cuLibraryLoadFromFile 1
#define HAS_cuLinkAddData 1
#define HAS_cuLinkAddData_v2 1
#define HAS_cuLinkAddFile 1
#define HAS_cuLinkAddFile_v2 1
#endif

#ifndef GPA_EXPORTED
/* Compiled per host: cuGetProcAddress[_v2] is defined here only where the real driver has it. */
#define GPA_EXPORTED 1
#define GPA_V2_EXPORTED 1
#endif

#define NAME_STRING(name, index) #name,
#define BASE_STRING(base) base,

/* Filled by the constructor; the trampolines jump through it. */
__attribute__((visibility("hidden"))) void *cumatrix_real[N_FORWARDED + 1];
static const char *const forwarded_names[N_FORWARDED + 1] = {FORWARDED(NAME_STRING) 0};
/* Base names (as given to cuGetProcAddress) introduced after EMULATED_VERSION. */
static const char *const hidden_bases[] = {HIDDEN(BASE_STRING) 0};

static void *real_handle;
static int (*real_gpa)(const char *, void **, int, unsigned long long);
static int (*real_gpa_v2)(const char *, void **, int, unsigned long long, int *);

__attribute__((visibility("hidden"))) void cumatrix_unresolved(void) {
    fprintf(stderr, "cumatrix emulated driver: an entry point of %s did not resolve\n", REAL_PATH);
    abort();
}

/* ------------------------------------------------------------------ the JIT's PTX ceiling
 *
 * A driver compiles PTX up to the ISA version of its own CUDA release and refuses newer PTX
 * with CUDA_ERROR_UNSUPPORTED_PTX_VERSION (PTX ISA release notes; numba-cuda issues 163 and
 * 262, JAX issue 19821).  The real driver behind this file is newer, so PTX that the emulated
 * driver would refuse is refused here, before the real JIT sees it.  Machine code (cubins,
 * SASS in a fat binary) goes to the real driver untouched.
 */
#define CUDA_ERROR_UNSUPPORTED_PTX_VERSION 222
#define ELF_MAGIC 0x464c457fu          /* "\x7fELF": a cubin */
#define FATBIN_MAGIC 0xba55ed50u       /* a fat binary's container */
#define FATBIN_WRAPPER_MAGIC 0x466243b1u /* __fatBinC_Wrapper_t: { magic, version, data, ... } */
/* ------------------------------------------------------------------ reading PTX as the JIT does
 *
 * The .version of PTX text, read by the rule cumatrix.binary.ptx.ptx_version follows (the two
 * readers are tested against one corpus, tests/ptx_corpus): an optional UTF-8 byte-order
 * mark; whitespace, `//` comments and `/ * * /` comments (across lines) skipped; tokens that are
 * no directive skipped; the first directive decides: `.version MAJOR.MINOR` is the version, any
 * other directive first means there is none.  A `.version` inside a comment or a string is not
 * the version.  The whole text is read (nvcc's own PTX begins with comment lines, and any number
 * of them may come first), up to n bytes or the NUL that ends PTX text. */
static int ptx_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }
static int ptx_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$';
}
static int ptx_at(const char *p, size_t i, size_t n) { return i < n && p[i] != 0; }
static int ptx_comment_at(const char *p, size_t i, size_t n) {
    return ptx_at(p, i, n) && p[i] == '/' && ptx_at(p, i + 1, n) && (p[i + 1] == '/' || p[i + 1] == '*');
}

/* Past whitespace and comments from i; n when a block comment never ends. */
static size_t ptx_skip_blank(const char *p, size_t i, size_t n) {
    for (;;) {
        while (ptx_at(p, i, n) && ptx_space(p[i])) i++;
        if (!ptx_comment_at(p, i, n)) return i;
        if (p[i + 1] == '/') {
            while (ptx_at(p, i, n) && p[i] != '\n') i++;
            continue;
        }
        i += 2;
        while (ptx_at(p, i, n) && !(p[i] == '*' && ptx_at(p, i + 1, n) && p[i + 1] == '/')) i++;
        if (!ptx_at(p, i, n)) return n;
        i += 2;
    }
}

static size_t ptx_digits(const char *p, size_t i, size_t n, int *value) {
    size_t start = i;
    *value = 0;
    while (ptx_at(p, i, n) && p[i] >= '0' && p[i] <= '9' && i - start < 4) *value = *value * 10 + (p[i++] - '0');
    return i - start;
}

/* The .version of PTX text (major * 100 + minor), reading at most n bytes or up to a NUL; 0 when
 * there is none. */
static int ptx_text_version(const char *p, size_t n) {
    size_t i = 0;
    if (ptx_at(p, 2, n) && (unsigned char)p[0] == 0xEF && (unsigned char)p[1] == 0xBB && (unsigned char)p[2] == 0xBF)
        i = 3;
    for (;;) {
        i = ptx_skip_blank(p, i, n);
        if (!ptx_at(p, i, n)) return 0;
        if (p[i] == '"') { /* a string (a .file name): nothing in it counts */
            for (i++; ptx_at(p, i, n) && p[i] != '"'; i++)
                if (p[i] == '\\' && ptx_at(p, i + 1, n)) i++;
            if (!ptx_at(p, i, n)) return 0;
            i++;
            continue;
        }
        if (p[i] == '.') { /* the first directive decides */
            size_t j = i + 1;
            while (ptx_at(p, j, n) && ptx_name_char(p[j])) j++;
            if (j - i - 1 != 7 || strncmp(p + i + 1, "version", 7) != 0) return 0;
            int major, minor;
            size_t k = ptx_skip_blank(p, j, n);
            if (k == j || !ptx_digits(p, k, n, &major)) return 0;
            while (ptx_at(p, k, n) && p[k] >= '0' && p[k] <= '9') k++;
            if (!ptx_at(p, k, n) || p[k] != '.' || !ptx_digits(p, k + 1, n, &minor)) return 0;
            return major * 100 + minor;
        }
        size_t start = i; /* another token: skipped */
        while (ptx_at(p, i, n) && !ptx_space(p[i]) && !strchr("\";{},", p[i]) && !ptx_comment_at(p, i, n)) i++;
        if (i == start) i++;
    }
}

static int (*real_ctx_get_device)(int *);
static int (*real_device_get_attribute)(int *, int, int);

/* The SM number of the current context's device (90 for 9.0), else device 0's; 0 if unknown. */
static int device_arch(void) {
    int dev = 0, major = 0, minor = 0;
    if (!real_device_get_attribute) return 0;
    if (!real_ctx_get_device || real_ctx_get_device(&dev) != 0) dev = 0;
    /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR (75) and _MINOR (76) */
    if (real_device_get_attribute(&major, 75, dev) != 0 || real_device_get_attribute(&minor, 76, dev) != 0) return 0;
    return major * 10 + minor;
}

/* Whether code for SM `code` (variant 'a', 'f' or 0) serves SM `arch`: CUDA C++ Programming
 * Guide, "Binary Compatibility", "PTX Compatibility", "Feature Availability" (the same rule as
 * cumatrix.binary.fatbin.DeviceCode.runs_on). */
static int runs_on(int sass, int code, char variant, int arch) {
    if (variant == 'a') return arch == code;
    if (sass || variant == 'f') return arch / 10 == code / 10 && arch >= code;
    return arch >= code;
}

static uint16_t rd16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t rd32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t rd64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* The PTX ISA version a fat binary would have the driver compile for the device: 0 when it has
 * SASS the device runs, or PTX the emulated driver accepts, or no code for the device at all
 * (the real driver then answers as an old one would); else the oldest PTX version it offers.
 * `end` bounds the reading when the size is known (a file: every container in it is read);
 * else the image is one container (what cuModuleLoadData and a registered wrapper hand over),
 * whose header is trusted as the driver trusts it, and nothing past it is read.  The entry
 * layout is cumatrix.binary.fatbin's. */
static int fatbin_refused_version(const unsigned char *p, const unsigned char *end) {
    int arch = device_arch(), oldest = 0;
    for (int containers = 0; containers < (end ? 4096 : 1); containers++) {
        if (end && p + 16 > end) break;
        if (end && rd64(p) == 0 && p + 24 <= end) { /* alignment padding between containers (a section) */
            p += 8;
            containers--;
            continue;
        }
        if (rd32(p) != FATBIN_MAGIC) break;
        uint32_t header = (uint32_t)(p[6] | p[7] << 8);
        uint64_t body = rd64(p + 8);
        const unsigned char *e = p + header, *cend = p + header + body;
        if (end && cend > end) return 0;
        while (e + 64 <= cend) {
            uint32_t kind = (uint32_t)(e[0] | e[1] << 8), ehs = rd32(e + 4), padded = rd32(e + 8);
            uint32_t version = rd32(e + 24), sm = rd32(e + 28);
            uint64_t flags = rd64(e + 40);
            if (ehs < 64) return 0;
            char variant = (flags & 0x100000) ? 'a' : (flags & 0x200000) ? 'f' : 0;
            if (kind == 2 && (!arch || runs_on(1, (int)sm, variant, arch))) return 0;
            if (kind == 1 && (!arch || runs_on(0, (int)sm, variant, arch))) {
                /* The text as the JIT reads it where it is stored plain; the entry's header for a
                 * compressed payload (LZ4 or zstd), as cumatrix.binary.fatbin reads it. */
                int isa = 0;
                if (!(flags & (0x2000 | 0x8000))) isa = ptx_text_version((const char *)e + ehs, padded);
                if (!isa) isa = (int)((version >> 16) * 100 + (version & 0xffff));
                if (!isa || isa <= PTX_CEILING) return 0;
                if (!oldest || isa < oldest) oldest = isa;
            }
            e += ehs + padded;
        }
        p = cend;
    }
    return oldest;
}

/* The PTX version to refuse an image for (0: hand it to the real driver).  `n` is the image's
 * size where known (0: read up to the NUL that ends PTX text, or as the headers say). */
static int refused_version(const void *image, size_t n) {
    const unsigned char *p = (const unsigned char *)image;
    if (!p || PTX_CEILING == 0 || (n && n < 4)) return 0;
    uint32_t magic = rd32(p);
    if (magic == ELF_MAGIC) return 0;
    if (magic == FATBIN_WRAPPER_MAGIC) {
        const unsigned char *data;
        memcpy(&data, p + 8, sizeof data);
        return data ? fatbin_refused_version(data, 0) : 0;
    }
    if (magic == FATBIN_MAGIC) return fatbin_refused_version(p, n ? p + n : 0);
    int isa = ptx_text_version((const char *)p, n ? n : (size_t)-1);
    return isa > PTX_CEILING ? isa : 0;
}

/* A host object (CU_JIT_INPUT_OBJECT: an ELF file whose .nv_fatbin section holds its device
 * code, as nvcc -c writes it): the version to refuse it for, read from that section. */
static int object_refused_version(const unsigned char *p, size_t n) {
    if (n < 64 || rd32(p) != ELF_MAGIC || p[4] != 2 || p[5] != 1) return 0; /* ELF64, little-endian */
    uint64_t shoff = rd64(p + 0x28);
    uint16_t shentsize = rd16(p + 0x3a), shnum = rd16(p + 0x3c), shstrndx = rd16(p + 0x3e);
    if (shentsize < 64 || shoff > n || shnum > (n - shoff) / shentsize || shstrndx >= shnum) return 0;
    const unsigned char *strtab = p + shoff + (size_t)shstrndx * shentsize;
    uint64_t stroff = rd64(strtab + 0x18), strsize = rd64(strtab + 0x20);
    if (stroff > n || strsize > n - stroff) return 0;
    for (uint16_t i = 0; i < shnum; i++) {
        const unsigned char *sh = p + shoff + (size_t)i * shentsize;
        uint32_t name = rd32(sh), type = rd32(sh + 4);
        uint64_t off = rd64(sh + 0x18), size = rd64(sh + 0x20);
        if (type == 8 /* SHT_NOBITS */ || name >= strsize || strsize - name < sizeof ".nv_fatbin" ||
            memcmp(p + stroff + name, ".nv_fatbin", sizeof ".nv_fatbin") != 0 || off > n || size > n - off)
            continue;
        return fatbin_refused_version(p + off, p + off + size);
    }
    return 0;
}

/* A static library (CU_JIT_INPUT_LIBRARY: an ar archive of host objects): the oldest version
 * to refuse one of its objects for. */
static int archive_refused_version(const unsigned char *p, size_t n) {
    if (n < 8 || memcmp(p, "!<arch>\n", 8) != 0) return 0;
    int oldest = 0;
    for (size_t at = 8; at + 60 <= n;) {
        const unsigned char *h = p + at; /* name[16] date[12] uid[6] gid[6] mode[8] size[10] "`\n" */
        if (h[58] != '`' || h[59] != '\n') break;
        size_t size = 0;
        for (int k = 48; k < 58 && h[k] >= '0' && h[k] <= '9'; k++) size = size * 10 + (size_t)(h[k] - '0');
        at += 60;
        if (size > n - at) break;
        int isa = object_refused_version(p + at, size);
        if (isa && (!oldest || isa < oldest)) oldest = isa;
        at += size + (size & 1);
    }
    return oldest;
}

/* A file's contents, NUL-terminated (NULL when it cannot be read: the real driver then says why). */
static unsigned char *read_file(const char *path, size_t *n) {
    FILE *f = path ? fopen(path, "rb") : 0;
    if (!f) return 0;
    unsigned char *buf = 0;
    size_t cap = 0, len = 0;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 131072;
            unsigned char *grown = realloc(buf, cap);
            if (!grown) { free(buf); fclose(f); return 0; }
            buf = grown;
        }
        size_t got = fread(buf + len, 1, 65536, f);
        len += got;
        if (got < 65536) break;
    }
    fclose(f);
    buf[len] = 0;
    *n = len;
    return buf;
}

static int refused_file(const char *path) {
    size_t n = 0;
    unsigned char *buf = read_file(path, &n);
    int isa = buf ? refused_version(buf, n) : 0;
    free(buf);
    return isa;
}

/* cuLinkAdd*: CU_JIT_INPUT_PTX (1) and CU_JIT_INPUT_FATBINARY (2) are read as images, host
 * objects (3) by their .nv_fatbin section, libraries (4) object by object; cubins (0) and NVVM
 * IR (5) go to the real driver. */
static int refused_link_input(int type, const void *data, size_t size) {
    if (!data || PTX_CEILING == 0) return 0;
    if (type == 1 || type == 2) return refused_version(data, size);
    if (type == 3) return object_refused_version((const unsigned char *)data, size);
    if (type == 4) return archive_refused_version((const unsigned char *)data, size);
    return 0;
}

static int refused_link_file(int type, const char *path) {
    if (type < 1 || type > 4) return 0;
    size_t n = 0;
    unsigned char *buf = read_file(path, &n);
    int isa = buf ? refused_link_input(type, buf, n) : 0;
    free(buf);
    return isa;
}

/* Said once per refusal on stderr, as the driver's JIT log would be: a person reading the
 * cell's output sees why.  Not evidence: the return code is the behaviour. */
static int refuse(const char *entry, int isa) {
    fprintf(stderr, "cumatrix emulated driver %d.%d: %s: PTX ISA %d.%d is newer than this driver's "
            "JIT compiles (%d.%d): CUDA_ERROR_UNSUPPORTED_PTX_VERSION\n", EMULATED_VERSION / 1000,
            (EMULATED_VERSION % 1000) / 10, entry, isa / 100, isa % 100, PTX_CEILING / 100, PTX_CEILING % 100);
    return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
}

typedef void *CUmod;
#define JIT_OPTIONS unsigned int, int *, void **
#define LIB_OPTIONS int *, void **, unsigned int, int *, void **, unsigned int

#if HAS_cuModuleLoadData
static int (*real_cuModuleLoadData)(CUmod *, const void *);
int cuModuleLoadData(CUmod *module, const void *image) {
    int isa = refused_version(image, 0);
    return isa ? refuse("cuModuleLoadData", isa) : real_cuModuleLoadData(module, image);
}
#endif
#if HAS_cuModuleLoadDataEx
static int (*real_cuModuleLoadDataEx)(CUmod *, const void *, JIT_OPTIONS);
int cuModuleLoadDataEx(CUmod *module, const void *image, unsigned int n, int *options, void **values) {
    int isa = refused_version(image, 0);
    return isa ? refuse("cuModuleLoadDataEx", isa) : real_cuModuleLoadDataEx(module, image, n, options, values);
}
#endif
#if HAS_cuModuleLoadFatBinary
static int (*real_cuModuleLoadFatBinary)(CUmod *, const void *);
int cuModuleLoadFatBinary(CUmod *module, const void *fat) {
    int isa = refused_version(fat, 0);
    return isa ? refuse("cuModuleLoadFatBinary", isa) : real_cuModuleLoadFatBinary(module, fat);
}
#endif
#if HAS_cuModuleLoad
static int (*real_cuModuleLoad)(CUmod *, const char *);
int cuModuleLoad(CUmod *module, const char *fname) {
    int isa = refused_file(fname);
    return isa ? refuse("cuModuleLoad", isa) : real_cuModuleLoad(module, fname);
}
#endif
#if HAS_cuLibraryLoadData
static int (*real_cuLibraryLoadData)(CUmod *, const void *, LIB_OPTIONS);
int cuLibraryLoadData(CUmod *library, const void *code, int *jo, void **jv, unsigned int nj, int *lo, void **lv,
                      unsigned int nl) {
    int isa = refused_version(code, 0);
    return isa ? refuse("cuLibraryLoadData", isa) : real_cuLibraryLoadData(library, code, jo, jv, nj, lo, lv, nl);
}
#endif
#if HAS_cuLibraryLoadFromFile
static int (*real_cuLibraryLoadFromFile)(CUmod *, const char *, LIB_OPTIONS);
int cuLibraryLoadFromFile(CUmod *library, const char *file, int *jo, void **jv, unsigned int nj, int *lo, void **lv,
                          unsigned int nl) {
    int isa = refused_file(file);
    return isa ? refuse("cuLibraryLoadFromFile", isa)
               : real_cuLibraryLoadFromFile(library, file, jo, jv, nj, lo, lv, nl);
}
#endif
#define LINK_ADD_DATA(NAME)                                                                            \
    static int (*real_##NAME)(void *, int, void *, size_t, const char *, JIT_OPTIONS);                  \
    int NAME(void *state, int type, void *data, size_t size, const char *name, unsigned int n, int *options, \
             void **values) {                                                                         \
        int isa = refused_link_input(type, data, size);                                               \
        return isa ? refuse(#NAME, isa) : real_##NAME(state, type, data, size, name, n, options, values); \
    }
#define LINK_ADD_FILE(NAME)                                                                            \
    static int (*real_##NAME)(void *, int, const char *, JIT_OPTIONS);                                 \
    int NAME(void *state, int type, const char *path, unsigned int n, int *options, void **values) {   \
        int isa = refused_link_file(type, path);                                                      \
        return isa ? refuse(#NAME, isa) : real_##NAME(state, type, path, n, options, values);         \
    }
#if HAS_cuLinkAddData
LINK_ADD_DATA(cuLinkAddData)
#endif
#if HAS_cuLinkAddData_v2
LINK_ADD_DATA(cuLinkAddData_v2)
#endif
#if HAS_cuLinkAddFile
LINK_ADD_FILE(cuLinkAddFile)
#endif
#if HAS_cuLinkAddFile_v2
LINK_ADD_FILE(cuLinkAddFile_v2)
#endif

/* This file's own load and link entry points, each with the real one it stands in front of. */
struct jit_entry { const char *name; void **real; };
#define JIT(NAME) {#NAME, (void **)&real_##NAME},
static const struct jit_entry jit_entries[] = {
#if HAS_cuModuleLoadData
    JIT(cuModuleLoadData)
#endif
#if HAS_cuModuleLoadDataEx
    JIT(cuModuleLoadDataEx)
#endif
#if HAS_cuModuleLoadFatBinary
    JIT(cuModuleLoadFatBinary)
#endif
#if HAS_cuModuleLoad
    JIT(cuModuleLoad)
#endif
#if HAS_cuLibraryLoadData
    JIT(cuLibraryLoadData)
#endif
#if HAS_cuLibraryLoadFromFile
    JIT(cuLibraryLoadFromFile)
#endif
#if HAS_cuLinkAddData
    JIT(cuLinkAddData)
#endif
#if HAS_cuLinkAddData_v2
    JIT(cuLinkAddData_v2)
#endif
#if HAS_cuLinkAddFile
    JIT(cuLinkAddFile)
#endif
#if HAS_cuLinkAddFile_v2
    JIT(cuLinkAddFile_v2)
#endif
    {0, 0},
};

/* The same checks in front of the entry points cuGetProcAddress hands out: the driver's
 * answer there need not be the address of its export of that name (and for cuLinkAddData it
 * depends on the version asked), so each keeps the pointer the real driver returned. */
static int (*via_cuModuleLoadData)(CUmod *, const void *);
static int gpa_cuModuleLoadData(CUmod *module, const void *image) {
    int isa = refused_version(image, 0);
    return isa ? refuse("cuModuleLoadData", isa) : via_cuModuleLoadData(module, image);
}
static int (*via_cuModuleLoadDataEx)(CUmod *, const void *, JIT_OPTIONS);
static int gpa_cuModuleLoadDataEx(CUmod *module, const void *image, unsigned int n, int *options, void **values) {
    int isa = refused_version(image, 0);
    return isa ? refuse("cuModuleLoadDataEx", isa) : via_cuModuleLoadDataEx(module, image, n, options, values);
}
static int (*via_cuModuleLoadFatBinary)(CUmod *, const void *);
static int gpa_cuModuleLoadFatBinary(CUmod *module, const void *fat) {
    int isa = refused_version(fat, 0);
    return isa ? refuse("cuModuleLoadFatBinary", isa) : via_cuModuleLoadFatBinary(module, fat);
}
static int (*via_cuModuleLoad)(CUmod *, const char *);
static int gpa_cuModuleLoad(CUmod *module, const char *fname) {
    int isa = refused_file(fname);
    return isa ? refuse("cuModuleLoad", isa) : via_cuModuleLoad(module, fname);
}
static int (*via_cuLibraryLoadData)(CUmod *, const void *, LIB_OPTIONS);
static int gpa_cuLibraryLoadData(CUmod *library, const void *code, int *jo, void **jv, unsigned int nj, int *lo,
                                 void **lv, unsigned int nl) {
    int isa = refused_version(code, 0);
    return isa ? refuse("cuLibraryLoadData", isa) : via_cuLibraryLoadData(library, code, jo, jv, nj, lo, lv, nl);
}
static int (*via_cuLibraryLoadFromFile)(CUmod *, const char *, LIB_OPTIONS);
static int gpa_cuLibraryLoadFromFile(CUmod *library, const char *file, int *jo, void **jv, unsigned int nj,
                                     int *lo, void **lv, unsigned int nl) {
    int isa = refused_file(file);
    return isa ? refuse("cuLibraryLoadFromFile", isa)
               : via_cuLibraryLoadFromFile(library, file, jo, jv, nj, lo, lv, nl);
}
static int (*via_cuLinkAddData)(void *, int, void *, size_t, const char *, JIT_OPTIONS);
static int gpa_cuLinkAddData(void *state, int type, void *data, size_t size, const char *name, unsigned int n,
                             int *options, void **values) {
    int isa = refused_link_input(type, data, size);
    return isa ? refuse("cuLinkAddData", isa) : via_cuLinkAddData(state, type, data, size, name, n, options, values);
}
static int (*via_cuLinkAddFile)(void *, int, const char *, JIT_OPTIONS);
static int gpa_cuLinkAddFile(void *state, int type, const char *path, unsigned int n, int *options, void **values) {
    int isa = refused_link_file(type, path);
    return isa ? refuse("cuLinkAddFile", isa) : via_cuLinkAddFile(state, type, path, n, options, values);
}

/* The names cuGetProcAddress is asked for that lead to a load or link entry point. */
struct jit_base { const char *name; void **via; void *own; };
#define JIT_BASE(NAME) {#NAME, (void **)&via_##NAME, (void *)gpa_##NAME},
static const struct jit_base jit_bases[] = {
    JIT_BASE(cuModuleLoad) JIT_BASE(cuModuleLoadData) JIT_BASE(cuModuleLoadDataEx) JIT_BASE(cuModuleLoadFatBinary)
    JIT_BASE(cuLibraryLoadData) JIT_BASE(cuLibraryLoadFromFile) JIT_BASE(cuLinkAddData) JIT_BASE(cuLinkAddFile)
    {0, 0, 0},
};

static const struct jit_base *jit_base_of(const char *symbol) {
    for (int i = 0; jit_bases[i].name; i++)
        if (strcmp(symbol, jit_bases[i].name) == 0) return &jit_bases[i];
    return 0;
}

/* Keep the real entry point cuGetProcAddress answered with, and hand out the check in front of it. */
static void jit_entry(const struct jit_base *base, void **pfn) {
    *base->via = *pfn;
    *pfn = base->own;
}

static void jit_load(void) {
    for (int i = 0; jit_entries[i].name; i++) {
        void *p = real_handle ? dlsym(real_handle, jit_entries[i].name) : 0;
        *jit_entries[i].real = p ? p : (void *)cumatrix_unresolved;
    }
    if (real_handle) {
        real_ctx_get_device = (int (*)(int *))dlsym(real_handle, "cuCtxGetDevice");
        real_device_get_attribute = (int (*)(int *, int, int))dlsym(real_handle, "cuDeviceGetAttribute");
    }
}

#ifdef CUMATRIX_RUNTIME_CONFIG
/* One slot per entry point of driver_entry_points.h, filled by the constructor. */
#define ENTRY_SLOT(name) __attribute__((visibility("hidden"))) void *cumatrix_slot_##name;
CUMATRIX_DRIVER_ENTRY_POINTS(ENTRY_SLOT)
#define ENTRY_SLOT_ROW(name) {#name, &cumatrix_slot_##name},
static const struct { const char *name; void **slot; } entry_slots[] = {
    CUMATRIX_DRIVER_ENTRY_POINTS(ENTRY_SLOT_ROW){0, 0}};
#endif

/* Where a cell with its own mount namespace finds the real driver: the sandbox and the docker
 * backend bind the real file here and this interposer over every name of libcuda the loader
 * may search (cumatrix.provision.drivers.PRIVATE_DRIVER_PATH, docs/emulation.md), so that this
 * path is the only way left to the real driver.  Without a mount namespace it does not exist,
 * and REAL_PATH, the real driver's own path, is used. */
#define PRIVATE_DRIVER_PATH "/.cumatrix-driver/libcuda.so.1"

/* The real driver, by absolute path, RTLD_LOCAL; never this interposer itself (REAL_PATH is
 * covered by it inside a sandbox: glibc then hands back this very object). */
static void *open_real_driver(void) {
    const char *paths[2] = {PRIVATE_DRIVER_PATH, REAL_PATH};
    for (int i = 0; i < 2; i++) {
        if (i == 0 && access(paths[i], F_OK) != 0) continue;
        void *h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "cumatrix emulated driver: cannot load the real driver: %s\n", dlerror());
            continue;
        }
        Dl_info self, there;
        void *sym = dlsym(h, "cuDriverGetVersion");
        if (sym && dladdr((void *)open_real_driver, &self) && dladdr(sym, &there) && self.dli_fbase == there.dli_fbase) {
            fprintf(stderr, "cumatrix emulated driver: %s is this emulated driver, not the real one\n", paths[i]);
            continue;
        }
        return h;
    }
    return 0;
}

__attribute__((constructor)) static void cumatrix_load(void) {
    if (real_handle) return;
    real_handle = open_real_driver();
    for (int i = 0; i < N_FORWARDED; i++) {
        void *p = real_handle ? dlsym(real_handle, forwarded_names[i]) : 0;
        cumatrix_real[i] = p ? p : (void *)cumatrix_unresolved;
    }
#ifdef CUMATRIX_RUNTIME_CONFIG
    for (int i = 0; entry_slots[i].name; i++) {
        void *p = real_handle ? dlsym(real_handle, entry_slots[i].name) : 0;
        *entry_slots[i].slot = p ? p : (void *)cumatrix_unresolved;
    }
#endif
    if (real_handle) {
        real_gpa = (int (*)(const char *, void **, int, unsigned long long))dlsym(real_handle, "cuGetProcAddress");
        real_gpa_v2 = (int (*)(const char *, void **, int, unsigned long long, int *))dlsym(real_handle,
                                                                                              "cuGetProcAddress_v2");
    }
    jit_load();
}

static int is_hidden(const char *symbol) {
#ifdef CUMATRIX_RUNTIME_CONFIG
    const char *end = cumatrix_config.hidden + CONFIG_HIDDEN_BYTES;
    for (const char *p = cumatrix_config.hidden; p < end && *p; p += strnlen(p, (size_t)(end - p)) + 1)
        if (strncmp(symbol, p, (size_t)(end - p)) == 0) return 1;
#endif
    for (int i = 0; hidden_bases[i]; i++)
        if (strcmp(symbol, hidden_bases[i]) == 0) return 1;
    return 0;
}

int cuDriverGetVersion(int *driverVersion) {
    if (!driverVersion) return 1; /* CUDA_ERROR_INVALID_VALUE */
    *driverVersion = EMULATED_VERSION;
    return 0;
}

#if HAS_GET_PROC_ADDRESS_V2
int cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags,
                        int *symbolStatus);
#endif
#if HAS_GET_PROC_ADDRESS
int cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags);
#endif

/* Entry points handed out through cuGetProcAddress must be this interposer's own where it
 * answers differently from the real driver, or a caller of the returned pointer (libcudart
 * resolves everything that way) would see the real version. */
static int own_entry(const char *symbol, int version, void **pfn) {
    if (strcmp(symbol, "cuDriverGetVersion") == 0) {
        *pfn = (void *)cuDriverGetVersion;
        return 1;
    }
    if (strcmp(symbol, "cuGetProcAddress") == 0) {
#if HAS_GET_PROC_ADDRESS_V2
        if (version >= 12000 && GPA_V2_EXPORTED) {
            *pfn = (void *)cuGetProcAddress_v2;
            return 1;
        }
#endif
#if HAS_GET_PROC_ADDRESS
        if (GPA_EXPORTED) {
            *pfn = (void *)cuGetProcAddress;
            return 1;
        }
#endif
    }
    (void)version;
    return 0;
}

#if HAS_GET_PROC_ADDRESS_V2
int cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags,
                        int *symbolStatus) {
    if (!real_handle) cumatrix_load();
    if (cudaVersion > EMULATED_VERSION) cudaVersion = EMULATED_VERSION;
    if (!symbol || !pfn) return real_gpa_v2 ? real_gpa_v2(symbol, pfn, cudaVersion, flags, symbolStatus) : 1;
    /* As the real driver answers below a symbol's introduction (docs/facts.md section 3):
     * CUDA_SUCCESS, NULL, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT. */
    if (is_hidden(symbol)) {
        *pfn = 0;
        if (symbolStatus) *symbolStatus = 2;
        return 0;
    }
    if (own_entry(symbol, cudaVersion, pfn)) {
        if (symbolStatus) *symbolStatus = 0;
        return 0;
    }
    const struct jit_base *jit = jit_base_of(symbol);
    if (jit) {
        /* Asked of the real driver first, so that what it says about the version holds; the
         * pointer handed out is then this file's own check in front of the same entry. */
        if (!real_gpa_v2) cumatrix_unresolved();
        int rc = real_gpa_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
        if (rc == 0 && *pfn) jit_entry(jit, pfn);
        return rc;
    }
    if (!real_gpa_v2) cumatrix_unresolved();
    return real_gpa_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
}
#endif

#if HAS_GET_PROC_ADDRESS
int cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags) {
    if (!real_handle) cumatrix_load();
    if (cudaVersion > EMULATED_VERSION) cudaVersion = EMULATED_VERSION;
    if (!symbol || !pfn) return real_gpa ? real_gpa(symbol, pfn, cudaVersion, flags) : 1;
    /* No status to report here: the real driver, asked at the capped version, answers for
     * hidden symbols as it does below their introduction. */
    if (own_entry(symbol, cudaVersion, pfn)) return 0;
    const struct jit_base *jit = jit_base_of(symbol);
    if (jit) {
        if (!real_gpa) cumatrix_unresolved();
        int rc = real_gpa(symbol, pfn, cudaVersion, flags);
        if (rc == 0 && *pfn) jit_entry(jit, pfn);
        return rc;
    }
    if (!real_gpa) cumatrix_unresolved();
    return real_gpa(symbol, pfn, cudaVersion, flags);
}
#endif

/* One trampoline per forwarded export: jump through its slot, arguments untouched.  The slot
 * is the table's entry (compiled per host) or the entry point's own (the prebuilt). */
#define JUMP_THROUGH(name, slot)                                                                 \
    ".globl " #name "\n.type " #name ", @function\n.p2align 4\n" #name ":\n"                       \
    "    jmp *" slot "(%rip)\n.size " #name ", .-" #name "\n"
#define TRAMPOLINE(name, index) JUMP_THROUGH(name, "cumatrix_real+8*" #index)
__asm__(".text\n" FORWARDED(TRAMPOLINE));
#ifdef CUMATRIX_RUNTIME_CONFIG
#define ENTRY_TRAMPOLINE(name) JUMP_THROUGH(name, "cumatrix_slot_" #name)
__asm__(".text\n" CUMATRIX_DRIVER_ENTRY_POINTS(ENTRY_TRAMPOLINE));
#endif
