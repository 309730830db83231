package profile

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/propio/propio-sandbox/schema"
)

// A profile's check against the schema starts with compiling the schema,
// most of the CPU time of a launch's reading of its profile (about 3 ms
// of a launcher's 50). A document the schema accepted is remembered, by
// the hash of the schema and of the document, as an empty file in the
// user's cache directory: the next launch of the same profile skips the
// schema. A document that changed, or another schema (another build of
// propio-sandbox), has another hash, and is checked; what the schema
// refused is never remembered, so its errors are always said.

// validateProfile checks plain against the profile schema, unless the
// schema accepted this very document before.
func validateProfile(plain any) ([]schema.Violation, error) {
	mark := acceptedMark(plain)
	if mark != "" {
		if _, err := os.Stat(mark); err == nil {
			return nil, nil
		}
	}
	violations, err := schema.ValidateProfile(plain)
	if err == nil && len(violations) == 0 && mark != "" {
		if os.MkdirAll(filepath.Dir(mark), 0o700) == nil {
			if f, err := os.OpenFile(mark, os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
				f.Close()
			}
		}
	}
	return violations, err
}

// acceptedMark is the file that says the schema accepted plain; "" when
// there is no cache directory, or plain has no JSON form.
func acceptedMark(plain any) string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	doc, err := json.Marshal(plain) // maps' keys sorted: one form per document
	if err != nil {
		return ""
	}
	h := sha256.New()
	h.Write(schema.ProfileJSON)
	h.Write([]byte{0})
	h.Write(doc)
	return filepath.Join(dir, "propio-sandbox", "accepted-profiles", hex.EncodeToString(h.Sum(nil)))
}
