// Package broker holds what credential brokering hands from the launcher to
// an allowlist sandbox's gateway, and what the sandbox trusts: the run's CA
// (made for each run, name-constrained to the hosts whose TLS the gateway
// terminates), the secrets (a sentinel and the real value for each
// variable), the file that carries them to the gateway, and the trust files
// of the sandbox (a PEM bundle, a Java trust store).
//
// The channel is a file, Run in RunFile, mode 0600, in a directory of the
// user's (0700) that is mounted into the gateway's container only: never on
// a command line, in an environment or a label, so nothing of it is in any
// container's configuration. The gateway reads it once and removes it
// (TakeRun): after that the values live in the gateway's memory alone. A
// gateway prepared ahead of a run takes a run's file the same way, when the
// run writes one into its directory.
//
// It prints nothing and knows neither the gateway nor the CLI.
package broker

import (
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

// Run is what one run hands its gateway: the CA it signs the certificates of
// the hosts it terminates TLS for with, and the secrets.
type Run struct {
	CA      string   `json:"ca"`     // PEM certificate
	CAKey   string   `json:"ca_key"` // PEM PKCS #8 private key
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

// NewCA makes a run's CA: an ECDSA P-256 key and a self-signed certificate,
// valid from an hour before now (clocks drift) for CAValidity. names and
// addrs are the hosts whose TLS the gateway terminates: the certificate is
// constrained to them (a name covers its subdomains, *.name only them), so
// that it can vouch for nothing else. It returns both as PEM.
func NewCA(names []string, addrs []netip.Addr, now time.Time) (certPEM, keyPEM string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("making the run's CA key: %w", err)
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
	for _, n := range names {
		if rest, ok := strings.CutPrefix(n, "*."); ok {
			n = "." + rest
		}
		tmpl.PermittedDNSDomains = append(tmpl.PermittedDNSDomains, n)
	}
	for _, a := range addrs {
		tmpl.PermittedIPRanges = append(tmpl.PermittedIPRanges, &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())})
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", fmt.Errorf("making the run's CA: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", fmt.Errorf("making the run's CA: %w", err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})), nil
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
	tmp, err := os.CreateTemp(dir, ".run-*")
	if err != nil {
		return fmt.Errorf("writing the gateway's secrets: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("writing the gateway's secrets: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing the gateway's secrets: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing the gateway's secrets: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, RunFile)); err != nil {
		return fmt.Errorf("writing the gateway's secrets: %w", err)
	}
	return nil
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
