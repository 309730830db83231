// Package broker holds what credential brokering passes between the
// launcher and an allowlist sandbox's gateway, and what the sandbox trusts:
// the run's CA (made by the gateway as it starts, its key in the gateway's
// memory alone, name-constrained to the hosts whose TLS it terminates), the
// secrets (a sentinel and the real value for each variable), the files that
// carry them, and the trust files of the sandbox (a PEM bundle, a Java
// trust store).
//
// The channel is a directory of the user's (0700) mounted into the
// gateway's container only. The gateway writes its CA's certificate there
// (CAFile, never its key); the launcher writes the secrets there, Run in
// RunFile, mode 0600: never on a command line, in an environment or a
// label, so nothing of it is in any container's configuration. The gateway
// reads that once and removes it (TakeRun): after that the values live in
// the gateway's memory alone. A gateway prepared ahead of a run, or started
// again (a persistent sandbox's), takes a run's file the same way, when the
// run writes one into its directory.
//
// It prints nothing and knows neither the gateway nor the CLI.
package broker

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// RunFile is the name of the run's file in the broker directory.
const RunFile = "run.json"

// Run is what one run hands its gateway: the secrets.
type Run struct {
	Secrets []Secret `json:"secrets"`
}

// Secret is one variable's sentinel, which the sandbox holds, and its real
// value, which only the gateway does.
type Secret struct {
	Name     string `json:"name"`
	Sentinel string `json:"sentinel"`
	Value    string `json:"value"`
}

// CAValidity is how long a run's CA and the certificates it signs are
// valid: longer than any run.
const CAValidity = 400 * 24 * time.Hour

// newCA makes a run's CA: an ECDSA P-256 key and a self-signed
// certificate, valid from an hour before now (clocks drift) for
// CAValidity. hosts are those whose TLS the gateway terminates, names or
// addresses: the certificate is constrained to them (a name covers its
// subdomains, *.name only them), so that it can vouch for nothing else.
func newCA(hosts []string, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("making the run's CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "propio-sandbox run CA " + now.UTC().Format("2006-01-02T15:04:05Z"), Organization: []string{"propio-sandbox"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	for _, h := range hosts {
		if a, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
			tmpl.PermittedIPRanges = append(tmpl.PermittedIPRanges, &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())})
			continue
		}
		if rest, ok := strings.CutPrefix(h, "*."); ok {
			h = "." + rest
		}
		tmpl.PermittedDNSDomains = append(tmpl.PermittedDNSDomains, h)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("making the run's CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("making the run's CA: %w", err)
	}
	return cert, key, nil
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n.Add(n, big.NewInt(1))
}

// NewSentinel is the sentinel of one variable for one run: a fixed prefix,
// the variable's name and 128 random bits, so that it occurs nowhere by
// chance and says what it stands for.
func NewSentinel(name string) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail
	}
	return "propio-sentinel-" + name + "-" + hex.EncodeToString(b)
}

// WriteRun writes r as dir/RunFile, mode 0600, atomically: a gateway never
// reads half of it. dir must exist; MakeDir makes one.
func WriteRun(dir string, r Run) error {
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("writing the gateway's secrets: %w", err)
	}
	if err := writeAtomic(dir, RunFile, data, 0o600); err != nil {
		return fmt.Errorf("writing the gateway's secrets: %w", err)
	}
	return nil
}

// WriteCA writes the run's CA certificate (PEM) as dir/CAFile, mode 0644,
// atomically: the gateway's, for the launcher to read (ReadCA).
func WriteCA(dir string, certPEM []byte) error {
	if err := writeAtomic(dir, CAFile, certPEM, 0o644); err != nil {
		return fmt.Errorf("writing the run's CA certificate: %w", err)
	}
	return nil
}

// caWait bounds how long ReadCA waits for the gateway's CA certificate
// (its gateway has started: the certificate comes in milliseconds).
const caWait = 30 * time.Second

// ReadCA waits until the gateway whose broker directory is dir has written
// its CA certificate, and returns it, as PEM. The certificate must parse,
// be a CA's and hold no key: the launcher has nothing else of the CA.
func ReadCA(ctx context.Context, dir string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, caWait)
	defer cancel()
	path := filepath.Join(dir, CAFile)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		data, err := os.ReadFile(path)
		if err == nil {
			return checkCA(data)
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("reading the gateway's CA certificate: %w", err)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("the gateway wrote no CA certificate in %s within %s: %w", dir, caWait, ctx.Err())
		case <-tick.C:
		}
	}
}

// checkCA is data, one PEM CA certificate and nothing else.
func checkCA(data []byte) (string, error) {
	block, rest := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) > 0 {
		return "", errors.New("the gateway's CA certificate file holds something else than one certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil || !cert.IsCA {
		return "", fmt.Errorf("the gateway's CA certificate is not a CA's (%v)", err)
	}
	return string(data), nil
}

// writeAtomic writes data as dir/name with mode, through a temporary file
// renamed into place.
func writeAtomic(dir, name string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, name))
}

// ErrNoRun: the broker directory holds no run's file (yet).
var ErrNoRun = errors.New("no run's secrets in the broker directory")

// TakeRun reads dir/RunFile and removes it, so that the values are on no
// disk once the gateway has them. Its error never holds the file's content.
func TakeRun(dir string) (Run, error) {
	path := filepath.Join(dir, RunFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Run{}, fmt.Errorf("%w (%s)", ErrNoRun, dir)
	}
	if err != nil {
		return Run{}, fmt.Errorf("reading the run's secrets: %w", err)
	}
	if err := os.Remove(path); err != nil {
		return Run{}, fmt.Errorf("removing the run's secrets once read: %w", err)
	}
	var r Run
	if err := json.Unmarshal(data, &r); err != nil {
		return Run{}, errors.New("reading the run's secrets: the file is not a run's (its content is not shown)")
	}
	return r, nil
}

// MakeDir makes the broker directory of project under base, mode 0700
// (only the user enters it; the gateway runs as the user), and returns it.
// One left by an earlier run of the same name is emptied.
func MakeDir(base, project string) (string, error) {
	dir := filepath.Join(base, project)
	if err := os.MkdirAll(base, 0o700); err != nil {
		return "", fmt.Errorf("making the broker directory: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("making the broker directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("making the broker directory: %w", err)
	}
	return dir, nil
}

// BaseDirs are the directories of the user's broker directories (one per
// sandbox, mounted into its gateway) and of the sandboxes' trust files (one
// per sandbox, mounted read-only into it): under
// $XDG_RUNTIME_DIR/propio-sandbox (in memory, private to the user, emptied
// at logout), else $XDG_STATE_HOME/propio-sandbox (~/.local/state when
// unset).
func BaseDirs() (brokerDir, caDir string, err error) {
	base := ""
	if rt := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(rt) {
		base = filepath.Join(rt, "propio-sandbox")
	} else {
		state := os.Getenv("XDG_STATE_HOME")
		if !filepath.IsAbs(state) {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", "", fmt.Errorf("finding the broker directory: %w", err)
			}
			state = filepath.Join(home, ".local", "state")
		}
		base = filepath.Join(state, "propio-sandbox")
	}
	return filepath.Join(base, "broker"), filepath.Join(base, "ca"), nil
}
