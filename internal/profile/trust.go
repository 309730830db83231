package profile

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/propio/propio-sandbox/internal/fsutil"
)

// ErrUntrusted is returned (wrapped) when a repository profile is new or has
// changed since the user last trusted it.
var ErrUntrusted = errors.New("profile is not trusted")

// TrustStore records which repository profiles the user has trusted, by the
// hash of every file of their extends chain. A checked-in profile lives in a
// workspace the agent can write, so it must not be able to widen its own
// sandbox: any change to it needs the user's trust again.
type TrustStore struct {
	// Dir is $XDG_STATE_HOME/propio-sandbox.
	Dir string
}

// maxStore bounds the trust store: a line per trusted profile and build.
const maxStore = 64 << 20

func (s TrustStore) file() string { return filepath.Join(s.Dir, "trusted.json") }

// NeedsTrust reports whether a resolved profile must be trusted before it
// runs: its leaf is a file inside the workspace.
func NeedsTrust(p *Profile, workspace string) bool {
	if p.Meta.Builtin() || len(p.Meta.Chain) == 0 {
		return false
	}
	for _, s := range p.Meta.Chain {
		if inWorkspace(workspace, s.Path, s.Real) {
			return true
		}
	}
	return false
}

// inWorkspace reports whether a profile file, by its path as named (path)
// or with its directory's links resolved (real), is in the workspace: a link
// in the workspace to a file elsewhere is the workspace's, and so is a file
// of the workspace named through a link to it.
func inWorkspace(workspace, path, real string) bool {
	return workspace != "" && (path != "" && fsutil.Within(workspace, path) || real != "" && fsutil.Within(workspace, real))
}

// digest is the hash of the whole chain: every file and its content. A file
// is named by its absolute path, not by how it was shown, so that the digest
// does not depend on the current directory or on how the profile was named.
func digest(p *Profile) string {
	h := sha256.New()
	for _, s := range p.Meta.Chain {
		name := s.File
		if s.Path != "" {
			name = s.Path
		}
		fmt.Fprintf(h, "%s\x00%s\x00", name, s.SHA256)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (s TrustStore) read() (map[string]string, error) {
	data, err := fsutil.ReadRegular(s.file(), maxStore)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the trust store: %s %s", s.file(), fsutil.Problem(err))
	}
	m := map[string]string{}
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("reading trust store %s: %w", s.file(), err)
	}
	return m, nil
}

// Verify returns nil when the profile is trusted as it is now, and an error
// wrapping ErrUntrusted when it is new or changed.
func (s TrustStore) Verify(p *Profile) error {
	m, err := s.read()
	if err != nil {
		return err
	}
	leaf := p.Meta.Chain[0].Path
	switch got, ok := m[leaf]; {
	case !ok:
		return fmt.Errorf("%s is new: %w", p.Meta.File, ErrUntrusted)
	case got != digest(p):
		return fmt.Errorf("%s changed since it was trusted: %w", p.Meta.File, ErrUntrusted)
	}
	return nil
}

// Record is a record of the trust store besides a profile's own, such as an
// image build's: the digest trusted under Key, and the text it digests,
// kept beside the store (in trusted-manifests/) so that a later change can
// be told file by file. trusted.json stays an object of keys to digests.
type Record struct {
	Key, Digest string
	Text        []byte
}

func (s TrustStore) manifest(digest string) string {
	return filepath.Join(s.Dir, "trusted-manifests", digest+".json")
}

// Lookup returns the digest trusted under key, and the text kept with it
// (nil when it is not there, or is not what the digest says).
func (s TrustStore) Lookup(key string) (digest string, text []byte, found bool, err error) {
	m, err := s.read()
	if err != nil {
		return "", nil, false, err
	}
	digest, found = m[key]
	if !found {
		return "", nil, false, nil
	}
	if b, err := fsutil.ReadRegular(s.manifest(digest), maxStore); err == nil {
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) == digest {
			text = b
		}
	}
	return digest, text, true, nil
}

// Trust records the profile (when p is not nil) and the records as trusted
// as they are now. The store is replaced atomically: a failure leaves the
// previous one intact.
func (s TrustStore) Trust(p *Profile, records ...Record) error {
	m, err := s.read()
	if err != nil {
		return err
	}
	if p != nil {
		m[p.Meta.Chain[0].Path] = digest(p)
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("recording trust: %w", err)
	}
	for _, e := range records {
		m[e.Key] = e.Digest
		if e.Text == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(s.manifest(e.Digest)), 0o700); err != nil {
			return fmt.Errorf("recording trust: %w", err)
		}
		if err := fsutil.WriteFileAtomic(s.manifest(e.Digest), e.Text, 0o600); err != nil {
			return fmt.Errorf("recording trust: %w", err)
		}
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(s.file(), append(data, '\n'), 0o600)
}
