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
    /// Freed small blocks kept for the next allocation of their class (see `pg_nghttp2_malloc`).
    struct pg_nghttp2_cached_block *cached[6];
    /// How many each list holds.
    unsigned cached_count[6];
} pg_nghttp2_allocator;

/// Small blocks, and why they are kept: nghttp2 allocates and frees the same few small
/// objects for every exchange (a stream, its outbound items, an rcbuf per header field it
/// decodes, the copied name/value array of each request it submits): about 19 malloc calls
/// per keep-alive request through a shared h2 upstream connection (issue 32, `scripts/bench`'s
/// counts). Each block carries a 16-byte header with its class (its capacity) and the size
/// asked for; a freed block of a class goes onto that class's list, up to
/// `PG_NGHTTP2_CACHED_PER_CLASS`, and the next allocation of the class takes it. The lists
/// are the session's own (a session is used from one thread at a time), emptied by
/// `pg_nghttp2_release_cache` when the session is idle and when it is deleted. The frame
/// buffer and the stream table (above) carry no header: they are recognised by address.
typedef struct pg_nghttp2_cached_block { struct pg_nghttp2_cached_block *next; } pg_nghttp2_cached_block;

/// The header before each block given out: its class (`PG_NGHTTP2_UNCACHED` for a large
/// block) and the size asked for. 16 bytes, so the block keeps malloc's alignment.
typedef struct pg_nghttp2_block_header { uint32_t block_class; uint32_t unused; uint64_t size; } pg_nghttp2_block_header;

#define PG_NGHTTP2_CLASSES 6
#define PG_NGHTTP2_SMALLEST_CLASS 64
#define PG_NGHTTP2_UNCACHED 0xFFu
#define PG_NGHTTP2_CACHED_PER_CLASS 16

/// The capacity of class `block_class`: 64, 128, 256, 512, 1024, 2048 bytes.
static inline size_t pg_nghttp2_class_capacity(uint32_t block_class) {
    return (size_t)PG_NGHTTP2_SMALLEST_CLASS << block_class;
}

/// The smallest class that holds `size` bytes, or `PG_NGHTTP2_UNCACHED`.
static inline uint32_t pg_nghttp2_class_for(size_t size) {
    for (uint32_t block_class = 0; block_class < PG_NGHTTP2_CLASSES; block_class++) {
        if (size <= pg_nghttp2_class_capacity(block_class)) return block_class;
    }
    return PG_NGHTTP2_UNCACHED;
}

/// A block with a header for `size` bytes: from its class's list when one is kept there.
static inline void *pg_nghttp2_block_alloc(pg_nghttp2_allocator *allocator, size_t size) {
    uint32_t block_class = pg_nghttp2_class_for(size);
    pg_nghttp2_block_header *header = NULL;
    if (block_class != PG_NGHTTP2_UNCACHED && allocator->cached[block_class] != NULL) {
        pg_nghttp2_cached_block *block = allocator->cached[block_class];
        allocator->cached[block_class] = block->next;
        allocator->cached_count[block_class] -= 1;
        header = (pg_nghttp2_block_header *)block;
    } else {
        size_t capacity = block_class == PG_NGHTTP2_UNCACHED ? size : pg_nghttp2_class_capacity(block_class);
        if (capacity > SIZE_MAX - sizeof(pg_nghttp2_block_header)) return NULL;
        header = (pg_nghttp2_block_header *)malloc(sizeof(pg_nghttp2_block_header) + capacity);
        if (header == NULL) return NULL;
    }
    header->block_class = block_class;
    header->unused = 0;
    header->size = size;
    return header + 1;
}

/// Gives back a block `pg_nghttp2_block_alloc` made: onto its class's list while the list
/// has room, else to the heap.
static inline void pg_nghttp2_block_free(pg_nghttp2_allocator *allocator, void *pointer) {
    pg_nghttp2_block_header *header = (pg_nghttp2_block_header *)pointer - 1;
    uint32_t block_class = header->block_class;
    if (block_class < PG_NGHTTP2_CLASSES && allocator->cached_count[block_class] < PG_NGHTTP2_CACHED_PER_CLASS) {
        pg_nghttp2_cached_block *block = (pg_nghttp2_cached_block *)header;
        block->next = allocator->cached[block_class];
        allocator->cached[block_class] = block;
        allocator->cached_count[block_class] += 1;
        return;
    }
    free(header);
}

/// Frees every kept block; returns the bytes given back to the heap.
static inline size_t pg_nghttp2_release_cache(pg_nghttp2_allocator *allocator) {
    size_t released = 0;
    for (uint32_t block_class = 0; block_class < PG_NGHTTP2_CLASSES; block_class++) {
        while (allocator->cached[block_class] != NULL) {
            pg_nghttp2_cached_block *block = allocator->cached[block_class];
            allocator->cached[block_class] = block->next;
            free(block);
            released += sizeof(pg_nghttp2_block_header) + pg_nghttp2_class_capacity(block_class);
        }
        allocator->cached_count[block_class] = 0;
    }
    return released;
}

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
/// Returns that block's size, or 0 when `pointer` is none of them (a block with a header).
static inline size_t pg_nghttp2_forget(pg_nghttp2_allocator *allocator, void *pointer) {
    if (pointer == NULL) return 0;
    size_t size = 0;
    if (pointer == allocator->frame_buffer) {
        size = allocator->frame_buffer_size;
        allocator->frame_buffer = NULL;
        allocator->frame_buffer_size = 0;
    }
    if (pointer == allocator->zeroed_block) {
        size = allocator->zeroed_block_size;
        allocator->zeroed_block = NULL;
        allocator->zeroed_block_size = 0;
    }
    return size;
}

static inline void *pg_nghttp2_malloc(size_t size, void *user) {
    pg_nghttp2_allocator *allocator = (pg_nghttp2_allocator *)user;
    void *memory = pg_nghttp2_take_frame_buffer(allocator, size);
    return memory != NULL ? memory : pg_nghttp2_block_alloc(allocator, size);
}

static inline void pg_nghttp2_free(void *pointer, void *user) {
    if (pointer == NULL) return;
    pg_nghttp2_allocator *allocator = (pg_nghttp2_allocator *)user;
    // The recognised blocks came from posix_memalign, without a header.
    if (pointer == allocator->frame_buffer || pointer == allocator->zeroed_block) {
        pg_nghttp2_forget(allocator, pointer);
        free(pointer);
        return;
    }
    pg_nghttp2_block_free(allocator, pointer);
}

static inline void *pg_nghttp2_calloc(size_t count, size_t size, void *user) {
    pg_nghttp2_allocator *allocator = (pg_nghttp2_allocator *)user;
    if (size != 0 && count > SIZE_MAX / size) return NULL;
    size_t page = pg_nghttp2_page_size();
    if (allocator->capturing && allocator->zeroed_block == NULL && size != 0 && count * size >= page) {
        void *memory = NULL;
        if (posix_memalign(&memory, page, count * size) == 0) {
            memset(memory, 0, count * size);
            allocator->zeroed_block = (uint8_t *)memory;
            allocator->zeroed_block_size = count * size;
            return memory;
        }
    }
    void *memory = pg_nghttp2_block_alloc(allocator, count * size);
    if (memory != NULL) memset(memory, 0, count * size);
    return memory;
}

static inline void *pg_nghttp2_realloc(void *pointer, size_t size, void *user) {
    pg_nghttp2_allocator *allocator = (pg_nghttp2_allocator *)user;
    // nghttp2 allocates its buffers with realloc(NULL, capacity) (nghttp2_buf_reserve).
    if (pointer == NULL) return pg_nghttp2_malloc(size, user);
    size_t old_size;
    if (pointer == allocator->frame_buffer || pointer == allocator->zeroed_block) {
        // Not done to either block by nghttp2 1.52; should another version move one, it
        // becomes an ordinary block (with a header) and is no longer released.
        // Allocated first: on failure the caller keeps the old block, which must stay
        // recognised (its free takes the no-header path).
        void *moved = pg_nghttp2_block_alloc(allocator, size);
        if (moved == NULL) return NULL;
        old_size = pg_nghttp2_forget(allocator, pointer);
        memcpy(moved, pointer, old_size < size ? old_size : size);
        free(pointer);
        return moved;
    }
    pg_nghttp2_block_header *header = (pg_nghttp2_block_header *)pointer - 1;
    if (header->block_class < PG_NGHTTP2_CLASSES && size <= pg_nghttp2_class_capacity(header->block_class)) {
        header->size = size;
        return pointer;
    }
    old_size = (size_t)header->size;
    void *moved = pg_nghttp2_block_alloc(allocator, size);
    if (moved == NULL) return NULL;
    memcpy(moved, pointer, old_size < size ? old_size : size);
    pg_nghttp2_block_free(allocator, pointer);
    return moved;
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
