package diskcap

import (
	"context"
	"maps"
	"slices"
)

// Trees measures directories of this host for a Gauge: what they hold now
// less what they held at the first measure (the baseline), plus what the
// sandbox's processes hold open after deleting it on their file systems.
//
// When a directory the baseline could read can no longer be read (the
// sandbox took its permissions away), the walk cannot see what it holds:
// the growth in use of the trees' file systems since the first measure
// then counts as the sandbox's, if it is more than the walk found.
type Trees struct {
	// Roots are the directories, looked up at each measure (a container's
	// writable layer is known only once the container exists).
	Roots func(context.Context) ([]string, error)
	// FromZero: no baseline; all the trees hold is the sandbox's (a
	// container's writable layer, which starts empty).
	FromZero bool
	// Held, when set, is what the sandbox's processes hold deleted on the
	// file systems devs (see Held).
	Held func(ctx context.Context, devs map[uint64]bool) int64

	started    bool
	base       int64
	unreadable map[FileID]string
	fs         map[uint64]string // file systems seen, a path on each
	fsStart    map[uint64]int64  // their use at the first measure
}

// Size is a Gauge's Size.
func (t *Trees) Size(ctx context.Context) (int64, error) {
	roots, err := t.Roots(ctx)
	if err != nil {
		return 0, err
	}
	if len(roots) == 0 && !t.started {
		return 0, nil // nothing yet (a container not made): the baseline waits for the trees
	}
	if !t.started {
		// The file systems' use first: what is written during the walk
		// counts against the sandbox, never for it.
		t.fsStart = map[uint64]int64{}
		for _, r := range roots {
			if d, err := Dev(r); err == nil {
				if u, err := Used(r); err == nil {
					t.fsStart[d] = u
				}
			}
		}
	}
	u, err := Walk(ctx, roots)
	if err != nil {
		return 0, err
	}
	if t.fs == nil {
		t.fs = map[uint64]string{}
	}
	for d, p := range u.FS {
		if _, ok := t.fs[d]; !ok {
			t.fs[d] = p
			if _, ok := t.fsStart[d]; !ok && !t.started {
				if used, err := Used(p); err == nil {
					t.fsStart[d] = used
				}
			}
		}
	}
	var held int64
	if t.Held != nil {
		devs := map[uint64]bool{}
		for d := range t.fs {
			devs[d] = true
		}
		held = t.Held(ctx, devs)
	}
	if !t.started {
		t.started = true
		t.unreadable = u.Unreadable
		if !t.FromZero {
			t.base = u.Bytes
		}
		return max(0, u.Bytes-t.base) + held, nil
	}
	size := max(0, u.Bytes-t.base) + held
	for id := range u.Unreadable {
		if _, before := t.unreadable[id]; before {
			continue
		}
		var grown int64
		for d, p := range t.fs {
			if start, ok := t.fsStart[d]; ok {
				if now, err := Used(p); err == nil {
					grown += max(0, now-start)
				}
			}
		}
		size = max(size, grown)
		break
	}
	return size, nil
}

// FS is a Gauge's FS: a path on each file system the trees span, as the
// last walk found them (the roots before the first).
func (t *Trees) FS() []string {
	if len(t.fs) == 0 {
		roots, _ := t.Roots(context.Background())
		return roots
	}
	return slices.Sorted(maps.Values(t.fs))
}

// Static is Roots for directories known beforehand.
func Static(roots ...string) func(context.Context) ([]string, error) {
	return func(context.Context) ([]string, error) { return roots, nil }
}
