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

/* Heap profiling (TRAY_OPTIONS=prof=1): writes the sampled allocations still live as a heap
 * profile in gperftools' text format (read by google-pprof, jeprof and tools/tray-prof) to
 * path, created or truncated; with path NULL, where the prof_file option says (stderr if
 * unset). Returns 0, or the errno of the failed open. Never allocates: a signal handler may
 * call it. With prof=0 the profile is empty. */
TRAY_EXPORT int tray_prof_dump(const char* path);
/* The same for the peak profile (prof_peak=1): the live sampled allocations at the moment
 * their estimated bytes were highest (within 2%); with path NULL, prof_file with ".peak"
 * appended. */
TRAY_EXPORT int tray_prof_dump_peak(const char* path);

/* Largest alignment the aligned functions accept (bytes). */
#define TRAY_MAX_ALIGNMENT ((size_t)1 << 29)

/* --- heaps ----------------------------------------------------------------------------------
 * A heap the program creates: every block allocated into it can be freed one by one as usual
 * (free, realloc, malloc_usable_size, operator delete, from any thread), or all at once by
 * tray_heap_reset (the heap stays) or tray_heap_destroy (the heap is gone), at a cost that
 * grows with the heap's pages, not its blocks. Several threads may allocate into one heap at
 * once; while it is reset or destroyed, no thread may be inside an allocation into it, nor
 * inside malloc or free with it as its default (debug mode reports one that is). A block used
 * after its heap was reset or destroyed is freed memory (debug mode: filled with
 * TRAY_FREED_PATTERN, or inaccessible), and freeing it is a double free.
 * See docs/GUIDE.md, "Heaps". */
typedef struct tray_heap tray_heap_t;
/* NULL with ENOMEM when out of memory. */
TRAY_EXPORT tray_heap_t* tray_heap_new(void);
/* Frees every block of the heap; the heap is gone. NULL does nothing. A thread whose default it
 * was allocates from its own heap again. */
TRAY_EXPORT void tray_heap_destroy(tray_heap_t* heap);
/* Frees every block of the heap; the heap stays, empty, and keeps a little of its memory for
 * what comes next (as much as a thread keeps). NULL does nothing. */
TRAY_EXPORT void tray_heap_reset(tray_heap_t* heap);
/* The C functions of the same name, into heap. tray_heap_realloc returns a block of heap: p
 * (a block of any heap, or NULL) stays where it is only if it is heap's already. */
TRAY_EXPORT TRAY_MALLOC_ATTR void* tray_heap_malloc(tray_heap_t* heap, size_t size);
TRAY_EXPORT TRAY_MALLOC_ATTR void* tray_heap_calloc(tray_heap_t* heap, size_t count, size_t size);
TRAY_EXPORT void* tray_heap_realloc(tray_heap_t* heap, void* p, size_t size);
TRAY_EXPORT TRAY_MALLOC_ATTR void* tray_heap_aligned_alloc(tray_heap_t* heap, size_t alignment,
                                                           size_t size);
/* From now on the calling thread's malloc, calloc, realloc, aligned allocations and operator
 * new allocate into heap (NULL: the thread's own heap again); returns the previous default
 * (NULL: the thread's own). Other threads are not affected. */
TRAY_EXPORT tray_heap_t* tray_heap_set_default(tray_heap_t* heap);
/* The heap p's block belongs to, or NULL (a block of a thread's own heap, or not ours). */
TRAY_EXPORT tray_heap_t* tray_heap_of(const void* p);

/* --- options ------------------------------------------------------------------------------
 * Sets a run-time option, as TRAY_OPTIONS="name=value" would (see docs/GUIDE.md, "Run-time options").
 * The memory limit is set so at run time: tray_option_set("memory_limit", "512m") and
 * tray_option_set("memory_limit_action", "fail"); a limit below what is held gives back at once.
 * Returns 0, EINVAL (unknown name or bad value; a warning goes to stderr) or EBUSY ("debug"
 * once the allocator has started: set it before the first allocation, or use TRAY_OPTIONS). */
TRAY_EXPORT int tray_option_set(const char* name, const char* value);

/* --- debug mode (debug=1) --------------------------------------------------------------------
 * Freed blocks hold TRAY_FREED_PATTERN in every 32-bit word (the first 8 bytes hold a list link
 * again once the block leaves quarantine); malloc'd blocks start as TRAY_ALLOC_PATTERN; the
 * bytes between the requested size and the end of the block hold TRAY_CANARY_BYTE. */
#define TRAY_FREED_PATTERN 0x1deadb0bu
#define TRAY_ALLOC_PATTERN 0xa110ca7eu
#define TRAY_CANARY_BYTE 0xfdu

/* --- statistics ------------------------------------------------------------------------------ */
#define TRAY_STATS_VERSION 5  /* 4: without reused_blocks; 3: that, and requested_bytes exact;
                                  2: without the memory_limit fields; 1: without unit_map_bytes
                                  either */
#define TRAY_STATS_MAX_CLASSES 64

typedef struct tray_class_stats {
  unsigned long long block_bytes;      /* size of every block of the class */
  unsigned long long page_bytes;       /* size of one page (slab) of the class */
  unsigned long long blocks_per_page;
  unsigned long long live_blocks;      /* allocations - frees */
  unsigned long long peak_live_blocks; /* sampled whenever the class needs a new page */
  unsigned long long allocations;      /* since the start of the process */
  unsigned long long frees;
  unsigned long long pages;            /* pages the class holds now */
  unsigned long long peak_pages;
  /* The sizes asked for, over all allocations, estimated (since version 4): each list of
     blocks a thread takes in counts at the size of the request that made it take the list, so
     the estimate stays within the class's span of sizes (docs/GUIDE.md, "How exact the counts
     are"). */
  unsigned long long requested_bytes;
} tray_class_stats;

typedef struct tray_stats {
  unsigned version;      /* set by the caller to TRAY_STATS_VERSION */
  unsigned class_count;  /* entries of classes[] in use */
  tray_class_stats classes[TRAY_STATS_MAX_CLASSES];
  struct {
    unsigned long long allocations, frees, live_blocks, live_bytes, peak_bytes;
    unsigned long long mapped_bytes;   /* address space of live and cached large blocks */
    /* Freed large memory kept for reuse: mappings in the cache, span chunks (large blocks
       up to 4 MiB) with free pages still resident, each counted as one block, and freed
       span blocks kept whole for the next request of their size (their touched bytes). */
    unsigned long long cached_blocks, cached_bytes;
  } large;
  unsigned long long mapped_bytes;     /* address space held from the OS, metadata included */
  unsigned long long committed_bytes;  /* of which not given back to the OS (at most resident) */
  unsigned long long resident_bytes;   /* resident size of the whole process (/proc/self/statm) */
  unsigned long long released_bytes;   /* total ever given back (madvise, munmap) */
  unsigned long long metadata_bytes;   /* heaps, segment headers, debug tables */
  unsigned long long segments;
  unsigned long long threads_alive;    /* threads that own a heap now */
  unsigned long long threads_exited;
  unsigned long long heaps_created;    /* heaps outlive threads and are reused */
  unsigned long long remote_frees;     /* frees of a block owned by another thread's heap */
  unsigned long long foreign_frees;    /* frees of pointers traymalloc does not own */
  unsigned long long debug_errors;     /* errors debug mode reported (debug_abort=0) */
  /* system calls; a process_madvise that gives back a list of ranges counts as one madvise */
  unsigned long long os_mmap, os_munmap, os_madvise, os_mremap, os_mprotect;
  /* address space the unit map's leaves hold (16 MiB each: one of zeros, one per 128 GiB range
     with segments), touched only where segments are; not in mapped_bytes (since version 2) */
  unsigned long long unit_map_bytes;
  /* The memory limit (since version 3; docs/GUIDE.md, "Memory limit"): its bytes (0: none),
     whether it is the cgroup's (less a margin) rather than memory_limit's, whether reaching
     it fails allocations (memory_limit_action=fail), how often an allocation found it passed,
     how many of those failed, and what giving back then returned to the OS. It counts what
     committed_bytes counts. */
  unsigned long long memory_limit_bytes, memory_limit_from_cgroup, memory_limit_fail;
  unsigned long long memory_limit_reached, memory_limit_failures, memory_limit_released_bytes;
  /* Blocks handed between threads (since version 5; docs/DESIGN.md, "Blocks handed between
     threads"): blocks of another thread's heap that the thread which freed them took in again
     for its own allocations. */
  unsigned long long reused_blocks;
} tray_stats;

/* Fills *out, whose version the caller has set to TRAY_STATS_VERSION (or an older one);
 * returns 0, or EINVAL for NULL or a version this library does not know. The counts are exact
 * for the calling thread's blocks and for threads that ended; those of other running threads
 * trail by at most the blocks of the pages they use (docs/GUIDE.md, "How exact the counts
 * are"). */
TRAY_EXPORT int tray_stats_get(tray_stats* out);

typedef void (*tray_write_fn)(void* context, const char* text, size_t length);
#define TRAY_STATS_TEXT 0u /* aligned table, human units */
#define TRAY_STATS_JSON 1u /* one JSON object on one line (format: docs/GUIDE.md, "Statistics") */
#define TRAY_STATS_PROMETHEUS 2u /* Prometheus's text exposition format 0.0.4, for a /metrics page */
/* Writes a dump through write(context, ...) in pieces (stderr if write is NULL). Never
 * allocates. Dumps of different threads take turns. Returns 0, EINVAL for unknown flags, or
 * EBUSY when called from a signal handler that interrupted a dump of the same thread. */
TRAY_EXPORT int tray_stats_print(tray_write_fn write, void* context, unsigned flags);

#ifdef __cplusplus
}
#endif

#endif /* TRAYMALLOC_H */
