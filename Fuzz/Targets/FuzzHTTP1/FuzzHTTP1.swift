import FuzzSupport

/// libFuzzer's entry: the bytes an app sends inside an admitted HTTP/1.1 tunnel.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHTTP1(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let start else { return 0 }
    TunnelHarness.run(.http1, UnsafeBufferPointer(start: start, count: count))
    return 0
}

/// The process entry (SwiftPM names it `FuzzHTTP1_main`): libFuzzer's driver, running `fuzzHTTP1`.
@_cdecl("FuzzHTTP1_main")
public func main(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runLibFuzzer(argc: argc, argv: argv, fuzzHTTP1)
}
