package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/internal/engine"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// TestRemoveOverlayConcurrently: two removals of one sandbox at once (gc
// and a launch's removal of leftovers, which both find a killed launcher's
// sandbox) both succeed and leave nothing, though each mounts the overlay
// volume once more (settling it) before removing it, and the other's
// removal may meet the volume in use by that helper.
func TestRemoveOverlayConcurrently(t *testing.T) {
	ctx := context.Background()
	eng := connectEngine(t)
	if ov, err := eng.OverlayCapable(ctx); err != nil || !ov.OK {
		t.Skipf("the engine cannot mount an overlay here: %v %s", err, ov.Why)
	}
	for round := range 5 {
		name := fmt.Sprintf("propio-test-remove-%d-%d", time.Now().UnixNano(), round)
		t.Cleanup(func() { eng.Remove(context.Background(), name, 0) })
		dir := t.TempDir()
		var o []string
		for _, d := range []string{"lower", "upper", "work"} {
			if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
				t.Fatal(err)
			}
			o = append(o, d+"dir="+filepath.Join(dir, d))
		}
		project := &types.Project{Name: name, Volumes: types.Volumes{"changeset": types.VolumeConfig{
			Name:       name + "_changeset",
			Driver:     "local",
			DriverOpts: map[string]string{"type": "overlay", "device": "overlay", "o": strings.Join(o, ",")},
			Labels:     types.Labels{engine.LabelProject: name},
		}}}
		if err := eng.CreateVolumes(ctx, project, testenv.ProbeImage); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Go(func() { errs[i] = eng.Remove(ctx, name, 0) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d: removal %d: %v", round, i, err)
			}
		}
		list, err := eng.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range list {
			if sb.Project == name {
				t.Errorf("round %d: left behind: %+v", round, sb)
			}
		}
	}
}
