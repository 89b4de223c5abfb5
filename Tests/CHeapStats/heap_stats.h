#ifndef PINGATE_CHEAPSTATS_H
#define PINGATE_CHEAPSTATS_H

// For tests only: glibc's malloc.h is not part of Swift's Glibc module, and memory tests
// need to know how many heap bytes are in use.

#include <malloc.h>
#include <stddef.h>

/// Bytes the heap has handed out and not yet taken back, across all arenas.
static inline size_t pg_heap_bytes_in_use(void) {
    struct mallinfo2 info = mallinfo2();
    return info.uordblks + info.hblkhd;
}

#endif
