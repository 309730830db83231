package engine

import (
	"context"
	"sync"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// apiClient is the engine client the Compose SDK uses, with one hook: the
// SDK forwards the launcher's signals to the sandbox with ContainerKill,
// which fails on a container that is created but not started yet, and the
// signal would be lost (the sandbox would then run on, its Ctrl+C ignored).
// The hook hears of that failure, so Run can stop the unstarted sandbox.
type apiClient struct {
	client.APIClient
	mu         sync.Mutex
	notRunning func(signal string)
}

// onNotRunning sets what to do when a forwarded signal finds the sandbox not
// running; nil to stop listening.
func (c *apiClient) onNotRunning(f func(signal string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.notRunning = f
}

func (c *apiClient) ContainerKill(ctx context.Context, id string, opts client.ContainerKillOptions) (client.ContainerKillResult, error) {
	res, err := c.APIClient.ContainerKill(ctx, id, opts)
	if err != nil && cerrdefs.IsConflict(err) {
		c.mu.Lock()
		f := c.notRunning
		c.mu.Unlock()
		if f != nil {
			f(opts.Signal)
		}
	}
	return res, err
}
