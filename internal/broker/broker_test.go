package broker

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testRun is a run with one secret.
func testRun() Run {
	return Run{Secrets: []Secret{{Name: "LLM_TOKEN", Sentinel: NewSentinel("LLM_TOKEN"), Value: "sk-real-value"}}}
}

// testIssuer is a run's CA for the hosts given.
func testIssuer(t *testing.T, hosts ...string) *Issuer {
	t.Helper()
	iss, err := NewIssuer(hosts, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

// TestIssuerConstrained: the certificates the issuer signs verify against
// the CA for the hosts it is constrained to, and no certificate the CA
// signs verifies for another host.
func TestIssuerConstrained(t *testing.T) {
	t.Parallel()
	iss := testIssuer(t, "llm.test", "*.wild.test", "203.0.113.7")
	roots := x509.NewCertPool()
	roots.AddCert(iss.CA())
	tests := map[string]bool{
		"llm.test":      true,
		"api.llm.test":  true, // a name covers its subdomains
		"a.wild.test":   true,
		"wild.test":     false, // *.name covers only them
		"evil.test":     false,
		"llm.test.evil": false,
		"203.0.113.7":   true,
		"203.0.113.8":   false,
	}
	for host, ok := range tests {
		c, err := iss.Certificate(host)
		if err != nil {
			t.Fatal(err)
		}
		opts := x509.VerifyOptions{DNSName: host, Roots: roots}
		_, err = c.Leaf.Verify(opts)
		if ok && err != nil {
			t.Errorf("%s: want the certificate to verify: %v", host, err)
		}
		if !ok && err == nil {
			t.Errorf("%s: the CA vouches for a host outside its constraints", host)
		}
	}
	if a, _ := iss.Certificate("LLM.test."); a != mustCert(t, iss, "llm.test") {
		t.Error("the certificate of a host is not kept")
	}
}

func mustCert(t *testing.T, iss *Issuer, host string) *tls.Certificate {
	t.Helper()
	c, err := iss.Certificate(host)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRunFile: the run's file is 0600, read once and gone, and a file that
// is not a run's is an error that does not show its content.
func TestRunFile(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	dir, err := MakeDir(base, "proj")
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("broker directory mode %v, want 0700", fi.Mode().Perm())
	}
	r := testRun()
	if err := WriteRun(dir, r); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, RunFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("run file: %v, mode %v, want 0600", err, fi.Mode().Perm())
	}
	got, err := TakeRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Secrets) != 1 || got.Secrets[0] != r.Secrets[0] {
		t.Errorf("TakeRun read %+v, want %+v", got.Secrets, r.Secrets)
	}
	if _, err := os.Stat(filepath.Join(dir, RunFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the run file is still there once taken: %v", err)
	}
	if _, err := TakeRun(dir); !errors.Is(err, ErrNoRun) {
		t.Errorf("TakeRun of a taken file: %v, want ErrNoRun", err)
	}
	os.WriteFile(filepath.Join(dir, RunFile), []byte("sk-real-value is not json"), 0o600)
	if _, err := TakeRun(dir); err == nil || strings.Contains(err.Error(), "sk-real-value") {
		t.Errorf("TakeRun of a bad file: %v, want an error without its content", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left in the broker directory: %v", entries)
	}
	// A directory left by an earlier run of the name is emptied.
	os.WriteFile(filepath.Join(dir, RunFile), []byte("old"), 0o600)
	if _, err := MakeDir(base, "proj"); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("an earlier run's file survives MakeDir: %v", entries)
	}
}

// TestCAFile: the gateway's CA certificate is read back once written, and
// a file that holds a key, or no CA, is refused.
func TestCAFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	iss := testIssuer(t, "llm.test")
	done := make(chan error, 1)
	var got string
	go func() {
		var err error
		got, err = ReadCA(context.Background(), dir)
		done <- err
	}()
	if err := WriteCA(dir, iss.CAPEM()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || got != string(iss.CAPEM()) {
		t.Fatalf("ReadCA: %v, %q", err, got)
	}
	if fi, err := os.Stat(filepath.Join(dir, CAFile)); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("the CA file: %v, want mode 0644", err)
	}
	bad := map[string]string{
		"a key after it": string(iss.CAPEM()) + "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
		"a leaf":         string(pemOf(mustCert(t, iss, "llm.test").Certificate[0])),
		"nothing":        "",
	}
	for name, content := range bad {
		os.WriteFile(filepath.Join(dir, CAFile), []byte(content), 0o644)
		if _, err := ReadCA(context.Background(), dir); err == nil {
			t.Errorf("%s: ReadCA took it", name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := ReadCA(ctx, t.TempDir()); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ReadCA of a directory without one: %v, want it to give up with its context", err)
	}
}

func pemOf(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestSentinel(t *testing.T) {
	t.Parallel()
	a, b := NewSentinel("LLM_TOKEN"), NewSentinel("LLM_TOKEN")
	if a == b || !strings.HasPrefix(a, "propio-sentinel-LLM_TOKEN-") || len(a) != len("propio-sentinel-LLM_TOKEN-")+32 {
		t.Errorf("sentinels %q and %q: want distinct, named, with 128 random bits", a, b)
	}
}

// TestJKSFormat reads the trust store back as the JKS format lays it out,
// and checks its integrity digest.
func TestJKSFormat(t *testing.T) {
	t.Parallel()
	ca := string(testIssuer(t, "llm.test").CAPEM())
	certs := Certificates(Bundle([]byte("not a certificate\n"), ca))
	if len(certs) != 1 {
		t.Fatalf("%d certificates in the bundle, want the CA", len(certs))
	}
	ks := JKS(certs, time.Unix(1700000000, 0))
	var magic, version, count uint32
	rd := bytes.NewReader(ks)
	binary.Read(rd, binary.BigEndian, &magic)
	binary.Read(rd, binary.BigEndian, &version)
	binary.Read(rd, binary.BigEndian, &count)
	if magic != 0xFEEDFEED || version != 2 || count != 1 {
		t.Fatalf("header %x %d %d", magic, version, count)
	}
	if !bytes.Contains(ks, certs[0]) {
		t.Error("the CA's DER is not in the store")
	}
	if len(ks) != 12+4+2+len("propio-sandbox-0")+8+2+5+4+len(certs[0])+20 {
		t.Errorf("store of %d bytes: not one trusted certificate entry and a digest", len(ks))
	}
}

// TestJavaTrustsTheRunsCA runs a real Java client (when a JDK is installed)
// against a TLS server on loopback whose certificate the issuer signed: with
// the trust store as javax.net.ssl.trustStore it connects; without, the
// handshake fails.
func TestJavaTrustsTheRunsCA(t *testing.T) {
	t.Parallel()
	java, err := exec.LookPath("java")
	if err != nil {
		t.Skip("no java on this host (Debian's openjdk-17-jdk-headless runs this test)")
	}
	iss := testIssuer(t, "llm.test", "127.0.0.1")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cert := mustCert(t, iss, "127.0.0.1")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "hello java") }),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{*cert}}}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })

	dir := t.TempDir()
	store := filepath.Join(dir, TrustStoreFile)
	os.WriteFile(store, JKS(Certificates(Bundle(nil, string(iss.CAPEM()))), time.Now()), 0o644)
	src := filepath.Join(dir, "Get.java")
	os.WriteFile(src, []byte(`import java.net.URI;
import java.net.http.*;
public class Get {
  public static void main(String[] a) throws Exception {
    var resp = HttpClient.newHttpClient().send(HttpRequest.newBuilder(URI.create(a[0])).build(), HttpResponse.BodyHandlers.ofString());
    System.out.println(resp.statusCode() + " " + resp.body());
  }
}
`), 0o644)
	url := "https://127.0.0.1:" + fmt.Sprint(ln.Addr().(*net.TCPAddr).Port) + "/"
	run := func(props ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, java, append(props, src, url)...).CombinedOutput()
		return string(out), err
	}
	out, err := run("-Djavax.net.ssl.trustStore="+store, "-Djavax.net.ssl.trustStoreType=JKS", "-Djavax.net.ssl.trustStorePassword="+TrustStorePassword)
	if err != nil || !strings.Contains(out, "200 hello java") {
		t.Fatalf("java with the run's trust store: %v\n%s", err, out)
	}
	if out, err := run(); err == nil || !strings.Contains(out, "PKIX path building failed") {
		t.Errorf("java without it connected, or failed otherwise: %v\n%s", err, out)
	}
}
