import CMallocTuning

/// Process-wide allocator settings for a relaying gate.
///
/// Why: relaying a large body moves through buffers of tens to hundreds of KiB that are
/// allocated and freed once per TLS flight (OpenSSL's record buffers, which
/// `SSL_MODE_RELEASE_BUFFERS` frees whenever they empty so idle tunnels cost little, and
/// the ciphertext buffers the TLS handler hands to the socket). With glibc's default trim
/// threshold (128 KiB, adjusted dynamically) each free at the top of the heap gives the
/// pages back to the kernel and the next allocation faults them in again, zeroed. A
/// `perf` profile of a 64 MiB download through the byte relay showed a quarter of the
/// gate's CPU in `sysmalloc`, page faults and page clearing. Keeping up to
/// `trimThresholdBytes` of free memory at the top of each heap stops that churn
/// (measured in the `scripts/bench` bulk rows: 2.9 → 1.9 s of gate CPU per GB relayed).
/// It costs at most that much resident memory per malloc arena, a fixed amount that
/// does not grow with the number of tunnels.
public enum HeapTuning {
    /// Free memory glibc may keep at the top of each heap instead of returning it.
    public static let trimThresholdBytes: Int32 = 4 << 20

    /// Applies the settings; call once at start-up, before the event loops allocate.
    /// Returns false where the C library offers no such knob (not glibc) or refused it.
    @discardableResult
    public static func applyForRelaying() -> Bool {
        // M_TRIM_THRESHOLD also turns off glibc's dynamic adjustment of the mmap
        // threshold, which is wanted: it leaves allocations above 128 KiB on mmap, so a
        // rare very large buffer is still returned to the kernel when freed.
        pg_malloc_set_trim_threshold(trimThresholdBytes) == 1
    }
}
