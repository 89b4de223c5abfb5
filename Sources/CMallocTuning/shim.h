// glibc's allocator knobs, which Swift's Glibc module does not import (<malloc.h> is not
// part of it). Used only by PinGate's HeapTuning.
#ifndef PINGATE_CMALLOCTUNING_SHIM_H
#define PINGATE_CMALLOCTUNING_SHIM_H
#include <stdlib.h> /* defines __GLIBC__ where the C library is glibc */
#if defined(__GLIBC__)
#include <malloc.h>
/// Sets M_TRIM_THRESHOLD; returns 1 on success (mallopt's convention).
static inline int pg_malloc_set_trim_threshold(int bytes) { return mallopt(M_TRIM_THRESHOLD, bytes); }
#else
static inline int pg_malloc_set_trim_threshold(int bytes) { (void)bytes; return 0; }
#endif
#endif
