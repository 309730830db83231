package sandbox

import (
	"context"

	cslaunch "github.com/propio/propio-sandbox/internal/changeset/launch"
)

// changeset prepares the changeset the sandbox writes to, when the profile
// has one (nil otherwise): kept only when the sandbox ran.
func (s *launch) changeset(ctx context.Context) (*cslaunch.Changeset, error) {
	if !s.Profile.Changeset() {
		return nil, nil
	}
	if s.Resume != "" {
		// Resuming removes the sandbox of a killed launcher that still
		// writes to the changeset, as gc does: not both at once.
		<-s.gcDone
	}
	cs, err := cslaunch.Prepare(ctx, s.rt, s.Profile, s.Env.Workspace, s.Resume, s.Streams.Err)
	if err != nil {
		return nil, err
	}
	s.adjust = append(s.adjust, cs.Adjust)
	return cs, nil
}

// dropChangeset handles the changeset of a sandbox that did not run: what
// it wrote, if it started at all, is kept; else the changeset goes.
func (s *launch) dropChangeset(cs *cslaunch.Changeset) {
	if cs == nil {
		return
	}
	if cs.Wrote() {
		if err := cs.Finish(s.Streams.Err, false); err != nil {
			s.report.Warn(err.Error())
		}
		return
	}
	if err := cs.Abandon(); err != nil {
		s.report.Warn("removing the changeset of a sandbox that did not run: " + err.Error())
	}
}

// ChangesetMode checks PROPIO_SANDBOX_CHANGESET_MODE; a bad value is a
// *cslaunch.ModeError, which carries what to do about it.
func ChangesetMode() error {
	_, err := cslaunch.Wanted()
	return err
}

// DoctorChangesetMode says how a changeset would be made in e's workspace
// on the engine the checks reached: for doctor.
func DoctorChangesetMode(e Env) func(context.Context, *Conn) (string, string) {
	return func(ctx context.Context, c *Conn) (string, string) {
		want, err := cslaunch.Wanted()
		if err != nil {
			return "", ""
		}
		ov, err := c.Runtime.OverlayCapable(ctx)
		if err != nil {
			return "", ""
		}
		mode, why, err := cslaunch.ChooseMode(want, ov.OK, ov.Why, []string{e.Workspace, e.Dirs.State})
		if err != nil {
			return "", ""
		}
		return string(mode), why
	}
}
