import FuzzSupport

/// libFuzzer's entry: the first byte picks a chunk size, the rest is fed in chunks of that
/// size, as a slow client would send it, to a fresh connection's head reading
/// (`ConnectHeadReader`: NIOHTTP1's decoder, `ConnectHeadHandler` and `ConnectHeadCheck`,
/// as `ConnectHandler` puts them in front of itself). Nothing may trap; there is at most
/// one verdict; a request it accepts names a port in range and a non-empty host, whose
/// authority text reads back as the same request; the bytes after an accepted head are
/// handed on as they came.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzConnectRequest(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let start else { return 0 }
    let bytes = UnsafeBufferPointer(start: start, count: count)
    guard let first = bytes.first else { return 0 }
    let chunk = Int(first % 64) + 1
    guard let reader = try? ConnectHeadReader(maximumHeadBytes: 2048) else { preconditionFailure("no reader") }
    var offset = 1
    var outcome = ConnectHeadReader.Outcome.needMoreBytes
    while offset < bytes.count {
        let end = min(offset + chunk, bytes.count)
        guard let next = try? reader.feed(bytes[offset..<end]) else { preconditionFailure("the embedded channel failed") }
        outcome = next
        offset = end
    }
    precondition(reader.verdicts <= 1, "\(reader.verdicts) verdicts from one connection")
    switch outcome {
    case .needMoreBytes:
        break
    case .request(let request, let leftover):
        precondition((1...65535).contains(request.port) && !request.host.isEmpty, "accepted \(request)")
        precondition(bytes.suffix(leftover.count).elementsEqual(leftover), "the bytes after the head changed")
        // The authority text must read back as the same request (it goes in logs and in the
        // upstream's SNI).
        guard case .request(let reparsed, _)? = try? ConnectHeadReader.read("CONNECT \(request.authority) HTTP/1.1\r\n\r\n") else {
            preconditionFailure("\(request.authority) does not read again")
        }
        precondition(reparsed == request, "\(request.authority) read again as \(reparsed)")
    case .rejected(let rejection):
        precondition([400, 405, 431].contains(rejection.status), "status \(rejection.status)")
    }
    return 0
}

/// The process entry (SwiftPM names it `FuzzConnectRequest_main`): libFuzzer's driver, running `fuzzConnectRequest`.
@_cdecl("FuzzConnectRequest_main")
public func main(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runLibFuzzer(argc: argc, argv: argv, fuzzConnectRequest)
}
