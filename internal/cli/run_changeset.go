package cli

import (
	"context"
	"errors"

	"github.com/propio/propio-sandbox/internal/changeset/launch"
	"github.com/propio/propio-sandbox/internal/engine"
)

// changesetEngine is the engine as a changeset's launch sees it.
type changesetEngine struct{ eng *engine.Engine }

func (e changesetEngine) OverlayCapable(ctx context.Context) (launch.Overlay, error) {
	ov, err := e.eng.OverlayCapable(ctx)
	return launch.Overlay(ov), err
}

func (e changesetEngine) ReleaseChangeset(ctx context.Context, id string) error {
	err := e.eng.ReleaseChangeset(ctx, id)
	if errors.Is(err, engine.ErrChangesetInUse) {
		return changesetInUse{err}
	}
	return err
}

// changesetInUse is the engine's ErrChangesetInUse as launch knows it, its
// message as it is.
type changesetInUse struct{ error }

func (e changesetInUse) Unwrap() error        { return e.error }
func (e changesetInUse) Is(target error) bool { return target == launch.ErrInUse }

// engineCopies are a changeset's copies as the engine takes them.
func engineCopies(cs []launch.VolumeCopy) []engine.VolumeCopy {
	var out []engine.VolumeCopy
	for _, c := range cs {
		out = append(out, engine.VolumeCopy(c))
	}
	return out
}
