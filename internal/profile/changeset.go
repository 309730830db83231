package profile

import (
	"fmt"
	"strconv"
	"strings"
)

// Modes of the workspace and of mounts.
const (
	ModeRW = "rw"
	ModeRO = "ro"
	// ModeChangeset: the sandbox writes to an overlay (or a copy) of the
	// source; the source stays untouched until the changeset is applied.
	ModeChangeset = "changeset"
)

// Changeset reports whether the workspace or any mount is in changeset mode.
func (p *Profile) Changeset() bool {
	if p.Workspace.Mode == ModeChangeset {
		return true
	}
	for _, m := range p.Mounts {
		if m.Mode == ModeChangeset {
			return true
		}
	}
	return false
}

// ForceChangeset puts the workspace in changeset mode (run --changeset),
// whatever the profile says, and checks the profile again for what that
// mode forbids.
func (p *Profile) ForceChangeset() error {
	p.Workspace.Mode = ModeChangeset
	var errs List
	p.checkChangeset(func(msg, hint string, path ...string) { errs = append(errs, p.errorAt(msg, hint, path...)) })
	p.sortByPos(errs)
	return errs.err()
}

// checkChangeset refuses a mount inside a workspace in changeset mode: the
// engine would make its mount point in the changeset, where it would show
// as a directory the agent added. (workspace.readonly and hide are fine:
// they match paths that exist, so no mount point is made.)
func (p *Profile) checkChangeset(add func(msg, hint string, path ...string)) {
	if p.Workspace.Mode != ModeChangeset {
		return
	}
	ws := path0(p.Workspace.Target)
	for i, m := range p.Mounts {
		if strings.Contains(m.Target, "$") || strings.HasPrefix(m.Target, "~") {
			continue
		}
		t := path0(m.Target)
		if t != ws && strings.HasPrefix(t, strings.TrimSuffix(ws, "/")+"/") {
			add(fmt.Sprintf("%s is inside the workspace (%s), whose mode is changeset: its mount point would become part of the changeset", t, ws),
				"mount it outside "+ws+", or run the workspace in mode rw or ro", "mounts", strconv.Itoa(i), "target")
		}
	}
}
