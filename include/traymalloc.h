/* traymalloc: a segregated size-class allocator.
 *
 * The prefixed API below is present in both libtraymalloc.so and libtraymalloc.a. It never
 * replaces the C library's malloc by itself: that is done by the override layer (the exported
 * malloc/free/new/delete of the same libraries), so tests and sanitizer builds can use the
 * allocator side by side with libc. Every function is thread-safe and async-signal-unsafe,
 * like malloc.
 */
#ifndef TRAYMALLOC_H
#define TRAYMALLOC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TRAY_EXPORT __attribute__((visibility("default")))
#define TRAY_MALLOC_ATTR __attribute__((malloc, warn_unused_result))
#else
#define TRAY_EXPORT
#define TRAY_MALLOC_ATTR
#endif

#define TRAY_VERSION_MAJOR 0
#define TRAY_VERSION_MINOR 1
#define TRAY_VERSION_PATCH 0

/* Same contracts as the C functions of the same name (errno set to ENOMEM on failure). */
TRAY_EXPORT TRAY_MALLOC_ATTR void* tray_malloc(size_t size);
TRAY_EXPORT TRAY_MALLOC_ATTR void* tray_calloc(size_t count, size_t size);
TRAY_EXPORT void* tray_realloc(void* ptr, size_t size);
TRAY_EXPORT void* tray_reallocarray(void* ptr, size_t count, size_t size);
TRAY_EXPORT void tray_free(void* ptr);
/* C23 free_sized / free_aligned_sized: size (and alignment) must match the allocation. */
TRAY_EXPORT void tray_free_sized(void* ptr, size_t size);
TRAY_EXPORT void tray_free_aligned_sized(void* ptr, size_t alignment, size_t size);

/* alignment must be a power of two no larger than TRAY_MAX_ALIGNMENT, else NULL with EINVAL. */
TRAY_EXPORT TRAY_MALLOC_ATTR void* tray_aligned_alloc(size_t alignment, size_t size);
/* Returns 0, EINVAL (alignment not a power of two, below sizeof(void*) or above
 * TRAY_MAX_ALIGNMENT) or ENOMEM; *out is untouched on failure. */
TRAY_EXPORT int tray_posix_memalign(void** out, size_t alignment, size_t size);
/* glibc memalign: an alignment that is not a power of two is rounded up to one. */
TRAY_EXPORT TRAY_MALLOC_ATTR void* tray_memalign(size_t alignment, size_t size);

/* Bytes usable at ptr (at least what was asked for, all writable); 0 for NULL or a pointer
 * traymalloc does not own. */
TRAY_EXPORT size_t tray_usable_size(const void* ptr);

/* 1 if ptr lies in memory traymalloc manages (answered in O(1) from the chunk map), else 0.
 * Says nothing about whether the block is live. */
TRAY_EXPORT int tray_owns(const void* ptr);

/* Gives every free page this process holds back to the OS now; returns 1 if any was. */
TRAY_EXPORT int tray_trim(void);

/* Largest alignment the aligned functions accept (bytes). */
#define TRAY_MAX_ALIGNMENT ((size_t)1 << 29)

/* Process-wide counters kept on slow paths (cheap enough to be always on). */
typedef struct tray_totals {
  size_t version;            /* sizeof(tray_totals): lets callers detect a newer layout */
  size_t bytes_mapped;       /* address space held from the OS: segments and large blocks */
  size_t bytes_in_pages;     /* bytes of pages owned by thread heaps (blocks live or cached) */
  size_t bytes_large;        /* bytes of live large blocks (usable size) */
  size_t bytes_purged;       /* total bytes ever given back with madvise or munmap */
  size_t segments_mapped;    /* segments currently mapped */
  size_t pages_acquired;     /* total pages handed to heaps */
  size_t large_allocations;  /* total large allocations */
  size_t heaps_created;      /* thread heaps ever created (heaps are reused after thread exit) */
  size_t heaps_abandoned;    /* heaps now parked without a thread */
  size_t foreign_frees;      /* frees of pointers traymalloc does not own (forwarded or ignored) */
} tray_totals;

/* Fills *out (out->version must be set to sizeof(tray_totals) by the caller); returns 0, or
 * -1 if the caller's struct is older than this library's. */
TRAY_EXPORT int tray_totals_get(tray_totals* out);

#ifdef __cplusplus
}
#endif

#endif /* TRAYMALLOC_H */
