package preflight

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/diskcap"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/profile"
)

// watchNote says what "watched" means, once, at the end of the reason.
var watchNote = fmt.Sprintf("watched: the launcher measures it (a walk when statfs says it may be over, or the engine's measure at intervals) and stops the sandbox past the cap (exit %d)", backend.ExitDiskCap)

// disk says how resources.disk holds here for each place the sandbox can
// write: its writable layer, /tmp and HOME, the workspace (and rw mounts),
// a changeset. It fails only when it cannot tell (no engine): the cap is
// applied somehow everywhere else.
func (c *checker) disk(ctx context.Context) Result {
	p := c.Profile
	limit := int64(p.Resources.Disk)
	if test, err := hostinfo.TestDisk(c.LookupEnv); err != nil {
		return fail(err.Error(), "unset "+hostinfo.EnvTestDisk+": it is for tests")
	} else if test > 0 && test < limit {
		limit = test
	}
	if _, err := c.connect(ctx); err != nil {
		return errNoEngine
	}
	if c.infoErr != nil {
		return fail(c.infoErr.Error(), "check that the engine answers (docker info)")
	}
	st := c.info.Storage
	var parts []string

	switch {
	case *p.Security.ReadOnlyRootfs:
		parts = append(parts, "writable layer: none (read-only root filesystem)")
	case st.Quota:
		parts = append(parts, "writable layer: capped by the engine, writes past it fail inside ("+st.Why+")")
	case st.Local && (st.Driver == "overlay2" || st.Driver == "overlay") && readableDir(c.info.DataDir):
		parts = append(parts, "writable layer: watched, a walk of its directory ("+st.Why+")")
	default:
		parts = append(parts, "writable layer: watched, the engine's measure ("+st.Why+")")
	}

	parts = append(parts, fmt.Sprintf("/tmp and HOME: tmpfs of %s each, writes past it fail inside", profile.ByteSize(min(int64(p.Resources.Tmp), limit))))

	rw := p.Workspace.Mode == profile.ModeRW
	var rwMounts int
	for _, m := range p.Mounts {
		if m.Mode == profile.ModeRW {
			rwMounts++
		}
	}
	where := "workspace"
	if rwMounts > 0 {
		where = fmt.Sprintf("workspace and %d rw mount(s)", rwMounts)
	}
	switch {
	case rw || rwMounts > 0:
		parts = append(parts, fmt.Sprintf("%s: watched, a walk of the tree (%s)", where, diskcap.FSType(c.Workspace)))
	case p.Workspace.Mode == profile.ModeRO:
		parts = append(parts, "workspace: none (read-only)")
	default:
		parts = append(parts, "workspace: in its changeset")
	}

	cs := "changeset: watched (an overlay's upper directory, or a copy's volume)"
	if c.Changeset != nil {
		switch mode, why := c.Changeset(ctx); mode {
		case generator.ChangesetOverlay:
			cs = "changeset: overlay, its upper directory watched"
		case generator.ChangesetCopy:
			how := "a walk of its volume"
			if !st.Local || !readableDir(c.info.DataDir) {
				how = "the engine's measure of its volume"
			}
			cs = fmt.Sprintf("changeset: copy (%s), watched, %s", why, how)
		}
	}
	parts = append(parts, cs, watchNote)
	return pass(fmt.Sprintf("cap %s; %s", profile.ByteSize(limit), strings.Join(parts, "; ")))
}

func readableDir(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	return err == nil
}
