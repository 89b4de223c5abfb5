// glibc's allocator knobs, which Swift's Glibc module does not import (<malloc.h> is not
// part of it). Used only by PinGate's HeapTuning.
#ifndef PINGATE_CMALLOCTUNING_SHIM_H
#define PINGATE_CMALLOCTUNING_SHIM_H
#include <stddef.h>
#include <stdlib.h> /* defines __GLIBC__ where the C library is glibc */
#if defined(__GLIBC__)
#include <malloc.h>
/// Sets M_TRIM_THRESHOLD; returns 1 on success (mallopt's convention).
static inline int pg_malloc_set_trim_threshold(int bytes) { return mallopt(M_TRIM_THRESHOLD, bytes); }
/// Free bytes held in the heap's arenas (mallinfo2's fordblks), or 0 where unknown.
static inline size_t pg_malloc_free_bytes(void) {
#if __GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33)
    struct mallinfo2 info = mallinfo2();
    return info.fordblks;
#else
    return 0;
#endif
}
/// Gives free pages of every arena back to the system (malloc_trim(0)); returns 1 if any
/// memory was released.
static inline int pg_malloc_trim(void) { return malloc_trim(0); }
#else
static inline int pg_malloc_set_trim_threshold(int bytes) { (void)bytes; return 0; }
static inline size_t pg_malloc_free_bytes(void) { return 0; }
static inline int pg_malloc_trim(void) { return 0; }
#endif
#endif
