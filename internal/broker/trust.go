package broker

import (
	"bytes"
	"crypto/sha1"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"time"
	"unicode/utf16"
)

// The sandbox's trust files, in the directory mounted read-only at CADir
// inside: the run's CA alone (NODE_EXTRA_CA_CERTS adds it to Node's own
// roots), the image's trust store with the CA at its end (the system store,
// SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, GIT_SSL_CAINFO), and
// the same certificates as a Java trust store (JAVA_TOOL_OPTIONS).
const (
	CAFile         = "ca.pem"
	BundleFile     = "bundle.pem"
	TrustStoreFile = "truststore.jks"
	// TrustStorePassword is the Java trust store's: it guards nothing
	// (the store holds public certificates), Java only wants one.
	TrustStorePassword = "changeit"
)

// Bundle is the image's trust store (PEM, possibly empty) with the run's
// CA after it.
func Bundle(store []byte, caPEM string) []byte {
	var b bytes.Buffer
	b.Write(store)
	if len(store) > 0 && !bytes.HasSuffix(store, []byte("\n")) {
		b.WriteByte('\n')
	}
	b.WriteString("# propio-sandbox: this run's CA, for the hosts whose TLS its gateway terminates\n")
	b.WriteString(caPEM)
	return b.Bytes()
}

// Certificates are the DER certificates of a PEM bundle, those that parse.
func Certificates(bundle []byte) [][]byte {
	var out [][]byte
	for {
		var block *pem.Block
		block, bundle = pem.Decode(bundle)
		if block == nil {
			return out
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(block.Bytes); err == nil {
			out = append(out, block.Bytes)
		}
	}
}

// JKS is a Java KeyStore (the JKS format, which every Java since 1.2 reads,
// as javax.net.ssl.trustStoreType JKS) holding certs as trusted
// certificates, its integrity checked with TrustStorePassword.
func JKS(certs [][]byte, now time.Time) []byte {
	var b bytes.Buffer
	w := func(v any) { _ = binary.Write(&b, binary.BigEndian, v) }
	w(uint32(0xFEEDFEED)) // magic
	w(uint32(2))          // version
	w(uint32(len(certs)))
	for i, der := range certs {
		w(uint32(2)) // a trusted certificate
		writeUTF(&b, fmt.Sprintf("propio-sandbox-%d", i))
		w(now.UnixMilli())
		writeUTF(&b, "X.509")
		w(uint32(len(der)))
		b.Write(der)
	}
	// The integrity check: SHA-1 of the password (UTF-16, big-endian),
	// "Mighty Aphrodite" and everything before.
	h := sha1.New()
	for _, c := range utf16.Encode([]rune(TrustStorePassword)) {
		h.Write([]byte{byte(c >> 8), byte(c)})
	}
	h.Write([]byte("Mighty Aphrodite"))
	h.Write(b.Bytes())
	b.Write(h.Sum(nil))
	return b.Bytes()
}

// writeUTF writes s as Java's DataOutput.writeUTF does, for ASCII: its
// length in two bytes, then its bytes.
func writeUTF(b *bytes.Buffer, s string) {
	_ = binary.Write(b, binary.BigEndian, uint16(len(s)))
	b.WriteString(s)
}
