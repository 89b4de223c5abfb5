import FuzzSupport
import PinGate

/// libFuzzer's entry: the first byte picks a chunk size, the rest is fed to a fresh
/// `ConnectRequestParser` in chunks of that size, as a slow client would send it. The
/// parser must never trap, must stop after its first verdict, and a request it accepts
/// must name a port in range and a non-empty host.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzConnectRequest(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let start else { return 0 }
    let bytes = UnsafeBufferPointer(start: start, count: count)
    guard let first = bytes.first else { return 0 }
    let chunk = Int(first % 64) + 1
    var parser = ConnectRequestParser(maximumHeadBytes: 2048)
    var offset = 1
    var decided = false
    while offset < bytes.count {
        let end = min(offset + chunk, bytes.count)
        let outcome = parser.feed(bytes[offset..<end])
        offset = end
        switch outcome {
        case .needMoreBytes:
            continue
        case .request(let request, _):
            precondition(!decided, "a second verdict from one parser")
            precondition((1...65535).contains(request.port) && !request.host.isEmpty, "accepted \(request)")
            // The authority text must parse back to the same request (it goes in logs
            // and in the upstream's SNI).
            var again = ConnectRequestParser()
            if case .request(let reparsed, _) = again.feed(Array("CONNECT \(request.authority) HTTP/1.1\r\n\r\n".utf8)) {
                precondition(reparsed == request, "\(request.authority) reparsed as \(reparsed)")
            } else {
                preconditionFailure("\(request.authority) does not parse again")
            }
            decided = true
        case .rejected(let rejection):
            precondition(!decided, "a second verdict from one parser")
            precondition([400, 405, 408, 431].contains(rejection.status), "status \(rejection.status)")
            decided = true
        }
    }
    return 0
}

/// The process entry (SwiftPM names it `FuzzConnectRequest_main`): libFuzzer's driver, running `fuzzConnectRequest`.
@_cdecl("FuzzConnectRequest_main")
public func main(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runLibFuzzer(argc: argc, argv: argv, fuzzConnectRequest)
}
