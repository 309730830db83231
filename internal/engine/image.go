package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// HasImage reports whether the engine has the image ref.
func (e *Engine) HasImage(ctx context.Context, ref string) (bool, error) {
	_, err := e.cli.Client().ImageInspect(ctx, ref)
	switch {
	case cerrdefs.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("looking up image %s: %w", ref, err)
	}
	return true, nil
}

// BuildImage builds the image tag from a build context (a tar stream with
// a Dockerfile at its root), with the classic builder and no network: the
// context must hold everything the image needs.
func (e *Engine) BuildImage(ctx context.Context, tag string, buildContext io.Reader) error {
	res, err := e.cli.Client().ImageBuild(ctx, buildContext, client.ImageBuildOptions{
		Tags:        []string{tag},
		Remove:      true,
		ForceRemove: true,
		NetworkMode: "none",
		Labels:      map[string]string{LabelImage: tag},
	})
	if err != nil {
		return fmt.Errorf("building %s: %w", tag, err)
	}
	defer res.Body.Close()
	dec := json.NewDecoder(res.Body)
	for {
		var msg struct {
			Error       string `json:"error"`
			ErrorDetail struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("building %s: reading the engine's answer: %w", tag, err)
		}
		if msg.Error != "" {
			return fmt.Errorf("building %s: %s", tag, msg.Error)
		}
	}
	if ok, err := e.HasImage(ctx, tag); err != nil || !ok {
		return errors.Join(fmt.Errorf("building %s: the engine reported no error but has no such image", tag), err)
	}
	return nil
}

// LabelImage marks the images propio-sandbox builds itself (the gateway's).
const LabelImage = "dev.propio-sandbox.image"

// HasNetwork reports whether the engine has a network of exactly this
// name (not one whose ID begins with it, which the engine would also find).
func (e *Engine) HasNetwork(ctx context.Context, name string) (bool, error) {
	res, err := e.cli.Client().NetworkInspect(ctx, name, client.NetworkInspectOptions{})
	switch {
	case cerrdefs.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("looking up network %s: %w", name, err)
	}
	return res.Network.Name == name, nil
}

// UsedSubnets lists the subnets of the engine's networks, so a sandbox
// network can be numbered apart from them.
func (e *Engine) UsedSubnets(ctx context.Context) ([]netip.Prefix, error) {
	list, err := e.cli.Client().NetworkList(ctx, client.NetworkListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing networks: %w", err)
	}
	var used []netip.Prefix
	for _, n := range list.Items {
		for _, c := range n.IPAM.Config {
			if c.Subnet.IsValid() {
				used = append(used, c.Subnet)
			}
		}
	}
	return used, nil
}
