package sandbox

// TEMPORARY until the changeset lifecycle lands (branch i15-changeset).

import (
	"context"
	"errors"
	"io"

	"github.com/propio/propio-sandbox/internal/engine"
)

type csRun struct{}

func (c *csRun) volumeCopies() []engine.VolumeCopy         { return nil }
func (c *csRun) finish(w io.Writer, copyFailed bool) error { return nil }

func (s *launch) changeset(ctx context.Context) (*csRun, error) {
	if s.Profile.Changeset() {
		return nil, errors.New("changeset: pending merge")
	}
	return nil, nil
}

func (s *launch) dropChangeset(cs *csRun) {}
