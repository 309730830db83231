package changeset

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/propio/propio-sandbox/internal/fsutil"
)

// Seal turns what the run left into changes.json and makes the changeset
// ready for review: in overlay mode from each mount's upper directory
// (whiteouts and opaque directories included), in copy mode by comparing
// each TreeDir with the base manifest and the original. It records, for
// every touched path, the content hash of the original as it was when the
// run started, so that apply can tell a conflict.
func (c *Changeset) Seal() error {
	// First version: no changes. Filled in below this commit.
	data, err := json.Marshal(struct{}{})
	if err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(c.dir, changesFile), data, 0o600); err != nil {
		return fmt.Errorf("sealing changeset %s: %w", c.ID, err)
	}
	c.State = StateReady
	return c.save()
}
