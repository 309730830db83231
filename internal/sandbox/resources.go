package sandbox

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/backend"
)

// Resizer carries out the agent's resources requests: it raises the agent
// container's limits live, never lowers them, and never beyond Max (the
// reference table's maximums: the host's cores and memory, and 1000
// processes). It keeps the limits as they are now.
type Resizer struct {
	// Update changes the limits of the running agent's container (the
	// fields above zero).
	Update func(ctx context.Context, r backend.Resources) error
	Max    backend.Resources

	mu  sync.Mutex
	cur backend.Resources
}

// NewResizer starts from the limits the sandbox was started with.
func NewResizer(cur, max backend.Resources, update func(context.Context, backend.Resources) error) *Resizer {
	return &Resizer{Update: update, Max: max, cur: cur}
}

// Current are the limits now.
func (z *Resizer) Current() backend.Resources {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.cur
}

// Check refuses a request that lowers a limit, raises none, or goes beyond
// Max, saying why and what may be asked.
func (z *Resizer) Check(req ask.Request) error { return z.check(req, z.Current()) }

func (z *Resizer) check(req ask.Request, cur backend.Resources) error {
	if req.Resources == nil {
		return fmt.Errorf("a resources request needs \"resources\"")
	}
	r := *req.Resources
	raises := false
	for _, f := range []struct {
		name          string
		ask, now, max float64
		show          func(float64) string
	}{
		{"cpus", r.CPUs, cur.CPUs, z.Max.CPUs, func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }},
		{"memory", float64(r.Memory), float64(cur.Memory), float64(z.Max.Memory), func(v float64) string {
			return ask.Bytes(int64(v)) + " (" + strconv.FormatInt(int64(v), 10) + " bytes)"
		}},
		{"pids", float64(r.PIDs), float64(cur.PIDs), float64(z.Max.PIDs), func(v float64) string { return strconv.FormatInt(int64(v), 10) }},
	} {
		switch {
		case f.ask <= 0:
		case f.ask < f.now:
			return fmt.Errorf("%s %s is below the current limit of %s: a request can only raise a limit", f.name, f.show(f.ask), f.show(f.now))
		case f.max > 0 && f.ask > f.max:
			return fmt.Errorf("%s %s is above the maximum of %s", f.name, f.show(f.ask), f.show(f.max))
		case f.ask > f.now:
			raises = true
		}
	}
	if !raises {
		return fmt.Errorf("nothing to raise: the limits are cpus %g, memory %s, pids %d", cur.CPUs, ask.Bytes(cur.Memory), cur.PIDs)
	}
	return nil
}

// Handle raises the limits as req asks (checked again: another request
// may have raised them meanwhile), and returns the limits now.
func (z *Resizer) Handle(ctx context.Context, req ask.Request) (map[string]any, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if err := z.check(req, z.cur); err != nil {
		return nil, err
	}
	r := *req.Resources
	up := backend.Resources{CPUs: r.CPUs, Memory: r.Memory, PIDs: r.PIDs}
	if err := z.Update(ctx, up); err != nil {
		return nil, err
	}
	if r.CPUs > 0 {
		z.cur.CPUs = r.CPUs
	}
	if r.Memory > 0 {
		z.cur.Memory = r.Memory
	}
	if r.PIDs > 0 {
		z.cur.PIDs = r.PIDs
	}
	return map[string]any{"cpus": z.cur.CPUs, "memory": z.cur.Memory, "pids": z.cur.PIDs}, nil
}
