import PinGateTLS

extension CertificateHashes {
    /// Both hashes of `certificate`: what pins of either kind compare against.
    public init(_ certificate: Certificate) {
        self.init(certificateSHA256: certificate.sha256Fingerprint, spkiSHA256: certificate.spkiSHA256)
    }
}
