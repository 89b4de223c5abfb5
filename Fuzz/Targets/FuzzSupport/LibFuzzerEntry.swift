import CLibFuzzer

/// The signature of `LLVMFuzzerTestOneInput`.
public typealias FuzzTest = @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt

/// Hands the process to libFuzzer's driver with `test` as the code under test.
///
/// Why not libFuzzer's own `main`: SwiftPM links every executable on Linux with its entry
/// point renamed to `<Module>_main` and `main` aliased to that name (`--defsym`), so
/// that tests can link executables. A fuzz target therefore defines `<Module>_main`
/// itself and calls this, which is the documented way to embed libFuzzer
/// (`LLVMFuzzerRunDriver`) and needs no change to how SwiftPM links.
public func runLibFuzzer(argc: CInt, argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?, _ test: FuzzTest) -> CInt {
    var count = argc
    var arguments = argv
    return LLVMFuzzerRunDriver(&count, &arguments, test)
}
