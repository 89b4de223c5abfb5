#ifndef PINGATE_CNGHTTP2_SHIM_H
#define PINGATE_CNGHTTP2_SHIM_H
// libnghttp2 imports directly; this header gives the module one entry point, and the
// allocator PinGateHTTP2's sessions are created with (nghttp2_session_*_new3).
#include <nghttp2/nghttp2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/// The allocator of one nghttp2 session, and what it knows about two of the session's
/// buffers whose pages can go back to the kernel while the session is idle.
///
/// Why: nghttp2 gives every session, at creation and for its whole life, one buffer of a
/// whole frame (16 KiB and a header, `aob.framebufs`) and a stream table of 256 buckets
/// (4 KiB, `streams`), although on an idle connection neither holds anything: each frame
/// is packed into the frame buffer from its start and handed out by
/// `nghttp2_session_mem_send`, and once that returns 0 the last frame is done and the
/// buffer reset; the table's buckets are zeroed as streams leave it. From the heap, their
/// pages are resident as soon as anything (this session or an earlier owner of the
/// memory) touched them: about 20 KiB of an idle tunnel's memory. Here both get pages of
/// their own, so that they can be handed back (MADV_DONTNEED): the frame buffer whenever
/// its content is dead, the table's pages when they are all zeros (so releasing them
/// changes no byte anyone can read: such a page comes back zero-filled). The next write
/// faults a zeroed page in.
///
/// Only what nghttp2 allocates while the session is being created is taken, when no byte
/// from the peer exists yet: as the frame buffer the first allocation of at least a frame's
/// payload (16,384 bytes), as the table the first zeroed one of at least a page. With
/// nghttp2 1.52 these are exactly the two above (the session object, 2.9 KiB, and the HPACK
/// tables, 1 KiB each, are smaller); were another version to allocate something else that
/// way, the table's is still released only when all zeros, and the frame buffer's only
/// while the session has no output in progress. Everything else comes from malloc as
/// nghttp2's default allocator would give it.
typedef struct pg_nghttp2_allocator {
    /// What nghttp2 is given (`mem_user_data` points back here).
    nghttp2_mem mem;
    /// The frame buffer, page aligned, or NULL (not allocated yet, not recognised, or freed).
    uint8_t *frame_buffer;
    /// Its size in bytes, as nghttp2 asked for it.
    size_t frame_buffer_size;
    /// The stream table, page aligned, or NULL.
    uint8_t *zeroed_block;
    /// Its size in bytes.
    size_t zeroed_block_size;
    /// Non-zero while the session is being created: the only time the blocks are recognised.
    int capturing;
} pg_nghttp2_allocator;

/// The smallest allocation taken for the frame buffer: one frame's payload.
#define PG_NGHTTP2_FRAME_BUFFER_MIN 16384

static inline size_t pg_nghttp2_page_size(void) {
    long size = sysconf(_SC_PAGESIZE);
    return size > 0 ? (size_t)size : 4096;
}

/// Page-aligned memory for the frame buffer when `size` is it, else NULL.
static inline void *pg_nghttp2_take_frame_buffer(pg_nghttp2_allocator *allocator, size_t size) {
    if (!allocator->capturing || allocator->frame_buffer != NULL || size < PG_NGHTTP2_FRAME_BUFFER_MIN) return NULL;
    void *memory = NULL;
    if (posix_memalign(&memory, pg_nghttp2_page_size(), size) != 0) return NULL;
    allocator->frame_buffer = (uint8_t *)memory;
    allocator->frame_buffer_size = size;
    return memory;
}

/// Forgets `pointer` if it is one of the recognised blocks (it is being freed or moved).
static inline void pg_nghttp2_forget(pg_nghttp2_allocator *allocator, void *pointer) {
    if (pointer == NULL) return;
    if (pointer == allocator->frame_buffer) {
        allocator->frame_buffer = NULL;
        allocator->frame_buffer_size = 0;
    }
    if (pointer == allocator->zeroed_block) {
        allocator->zeroed_block = NULL;
        allocator->zeroed_block_size = 0;
    }
}

static inline void *pg_nghttp2_malloc(size_t size, void *user) {
    void *memory = pg_nghttp2_take_frame_buffer((pg_nghttp2_allocator *)user, size);
    return memory != NULL ? memory : malloc(size);
}

static inline void pg_nghttp2_free(void *pointer, void *user) {
    pg_nghttp2_forget((pg_nghttp2_allocator *)user, pointer);
    free(pointer);
}

static inline void *pg_nghttp2_calloc(size_t count, size_t size, void *user) {
    pg_nghttp2_allocator *allocator = (pg_nghttp2_allocator *)user;
    size_t page = pg_nghttp2_page_size();
    if (allocator->capturing && allocator->zeroed_block == NULL && size != 0 && count <= SIZE_MAX / size
        && count * size >= page) {
        void *memory = NULL;
        if (posix_memalign(&memory, page, count * size) == 0) {
            memset(memory, 0, count * size);
            allocator->zeroed_block = (uint8_t *)memory;
            allocator->zeroed_block_size = count * size;
            return memory;
        }
    }
    return calloc(count, size);
}

static inline void *pg_nghttp2_realloc(void *pointer, size_t size, void *user) {
    // nghttp2 allocates its buffers with realloc(NULL, capacity) (nghttp2_buf_reserve).
    if (pointer == NULL) return pg_nghttp2_malloc(size, user);
    // Not done to either block by nghttp2 1.52; should another version move one, it
    // becomes ordinary heap memory and is no longer released.
    pg_nghttp2_forget((pg_nghttp2_allocator *)user, pointer);
    return realloc(pointer, size);
}

/// Readies `allocator` for a session about to be created (capturing on).
static inline void pg_nghttp2_allocator_init(pg_nghttp2_allocator *allocator) {
    memset(allocator, 0, sizeof *allocator);
    allocator->mem.mem_user_data = allocator;
    allocator->mem.malloc = pg_nghttp2_malloc;
    allocator->mem.free = pg_nghttp2_free;
    allocator->mem.calloc = pg_nghttp2_calloc;
    allocator->mem.realloc = pg_nghttp2_realloc;
    allocator->capturing = 1;
}

/// Gives the kernel back the frame buffer's whole pages from byte `from` on (rounded up
/// to a page). The caller promises nothing in them is live: the session's last
/// `nghttp2_session_mem_send` returned 0 and the bytes it handed out before were copied.
/// Returns the bytes released.
static inline size_t pg_nghttp2_release_frame_buffer(pg_nghttp2_allocator *allocator, size_t from) {
    if (allocator->frame_buffer == NULL) return 0;
    size_t page = pg_nghttp2_page_size();
    size_t start = (from + page - 1) / page * page;
    size_t end = allocator->frame_buffer_size / page * page; // the partial last page stays
    if (start >= end) return 0;
    if (madvise(allocator->frame_buffer + start, end - start, MADV_DONTNEED) != 0) return 0;
    return end - start;
}

/// Gives the kernel back each whole page of the stream table that holds only zeros, which
/// it refills with zeros when next touched: nothing anyone reads changes. Returns the
/// bytes released.
static inline size_t pg_nghttp2_release_zero_pages(pg_nghttp2_allocator *allocator) {
    if (allocator->zeroed_block == NULL) return 0;
    size_t page = pg_nghttp2_page_size(), released = 0;
    for (size_t offset = 0; offset + page <= allocator->zeroed_block_size; offset += page) {
        const uint64_t *words = (const uint64_t *)(allocator->zeroed_block + offset);
        uint64_t any = 0;
        for (size_t i = 0; i < page / sizeof *words; i++) any |= words[i];
        if (any == 0 && madvise(allocator->zeroed_block + offset, page, MADV_DONTNEED) == 0) released += page;
    }
    return released;
}

/// Bytes of `block`'s whole pages that are resident now (mincore), or -1.
static inline long pg_nghttp2_resident(const uint8_t *block, size_t size) {
    if (block == NULL) return -1;
    size_t page = pg_nghttp2_page_size();
    size_t pages = size / page;
    unsigned char vector[64];
    if (pages == 0 || pages > sizeof vector) return -1;
    if (mincore((void *)block, pages * page, vector) != 0) return -1;
    long resident = 0;
    for (size_t i = 0; i < pages; i++) resident += (vector[i] & 1) ? (long)page : 0;
    return resident;
}

#endif
