package engine

import (
	"context"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
)

// A container's networks named by name where their IDs belong (Podman's
// list) are given by their IDs; an engine that gives IDs is asked nothing
// more.
func TestContainerNetworksByID(t *testing.T) {
	for _, c := range []struct {
		name   string
		listed string // the NetworkID the engine lists the container with
		want   string
		asked  int // network lists
	}{
		{"podman", "p_sandbox", "0123abcd", 1},
		{"docker", "0123abcd", "0123abcd", 0},
		{"unknown network", "gone", "gone", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &networkLister{id: "0123abcd", listed: c.listed}
			got, err := (&apiClient{APIClient: f}).ContainerList(context.Background(), client.ContainerListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			key := "p_sandbox"
			if c.listed == "gone" {
				key = "gone"
			}
			if id := got.Items[0].NetworkSettings.Networks[key].NetworkID; id != c.want || f.lists != c.asked {
				t.Errorf("network ID %q after %d network lists; want %q after %d", id, f.lists, c.want, c.asked)
			}
		})
	}
}

// networkLister is an engine with one network, p_sandbox, and one container
// on it, listed with the NetworkID listed (under the name "gone" when that
// is it).
type networkLister struct {
	client.APIClient
	id, listed string
	lists      int
}

func (f *networkLister) ContainerList(context.Context, client.ContainerListOptions) (client.ContainerListResult, error) {
	key := "p_sandbox"
	if f.listed == "gone" {
		key = "gone"
	}
	return client.ContainerListResult{Items: []container.Summary{{
		ID:              "c1",
		NetworkSettings: &container.NetworkSettingsSummary{Networks: map[string]*network.EndpointSettings{key: {NetworkID: f.listed}}},
	}}}, nil
}

func (f *networkLister) NetworkList(context.Context, client.NetworkListOptions) (client.NetworkListResult, error) {
	f.lists++
	return client.NetworkListResult{Items: []network.Summary{{Network: network.Network{Name: "p_sandbox", ID: f.id}}}}, nil
}
