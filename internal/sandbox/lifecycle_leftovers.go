package sandbox

import (
	"context"
	"errors"
	"os"

	"github.com/propio/propio-sandbox/internal/backend"
)

// removeLeftovers removes the sandboxes whose launcher is gone (killed, so
// it could not tear them down): only what that launcher made, as a new
// launcher may be starting a sandbox of the same name. Sandboxes of live
// launchers, and of other hosts, are left alone, and so are those a
// process of this host answers for, holding their name (a background
// process removes them).
// list is what the engine listed. It returns the projects it removed.
func removeLeftovers(ctx context.Context, rt backend.Runtime, list []backend.Sandbox) ([]string, error) {
	dir, err := namesDir()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, s := range list {
		// A persistent sandbox's resources are its record's, whoever holds
		// its name (leftover asks the record).
		if !leftover(s) || s.Keep == "" && nameBusy(dir, s.Project, s.PID) {
			continue
		}
		if err := rt.Remove(ctx, s.Project, s.PID); err != nil {
			errs = append(errs, err)
			continue
		}
		dropRunDirs(s.Project)
		removed = append(removed, s.Project)
	}
	return removed, errors.Join(errs...)
}

// leftover reports whether the sandbox was left by a launcher of this host
// that is gone: its launcher's pid runs no more. A persistent sandbox's
// resources belong to its record, not to a pid (it is stopped on purpose,
// or between two supervisors): they are left over only when the record
// says nothing of them any more.
func leftover(s backend.Sandbox) bool {
	if s.Keep != "" {
		return backend.SameHost(s.Host) && keptLeftover(s)
	}
	return backend.SameHost(s.Host) && !backend.LauncherAlive(s.PID, s.Host)
}

// keptLeftover reports whether a persistent sandbox's resources are left
// over: its record is gone (down forgot it, or its directory was removed),
// is another sandbox's of the same name, says it is gone, or it never got
// past its start (its supervisor was killed then). A record that cannot
// be read (another user's) says nothing: the resources stay.
func keptLeftover(s backend.Sandbox) bool {
	rec, err := readRecord(s.Keep)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return true
	case err != nil:
		return false
	}
	rec = rec.current()
	return rec.ID != s.KeepID || rec.State == StateGone
}
