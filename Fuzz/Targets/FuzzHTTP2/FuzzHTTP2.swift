import FuzzSupport

/// libFuzzer's entry: the frames an app sends after the HTTP/2 preface inside an
/// admitted tunnel.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHTTP2(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let start else { return 0 }
    TunnelHarness.run(.http2, UnsafeBufferPointer(start: start, count: count))
    return 0
}

/// The process entry (SwiftPM names it `FuzzHTTP2_main`): libFuzzer's driver, running `fuzzHTTP2`.
@_cdecl("FuzzHTTP2_main")
public func main(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runLibFuzzer(argc: argc, argv: argv, fuzzHTTP2)
}
