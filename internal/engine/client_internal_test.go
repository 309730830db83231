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

// A wait that fails is answered with the container's exit code when it has
// exited, and by waiting again while it runs; an engine whose wait works
// is asked nothing more.
func TestWaitFailedAnswered(t *testing.T) {
	for _, c := range []struct {
		name     string
		state    container.State
		want     int64
		inspects int
	}{
		{"exited", container.State{Status: container.StateExited, ExitCode: 7}, 7, 1},
		{"running", container.State{Status: container.StateRunning, Running: true}, 3, 1},
		{"wait works", container.State{}, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &waiter{state: c.state, fail: c.name != "wait works"}
			w := (&apiClient{APIClient: f}).ContainerWait(context.Background(), "c1", client.ContainerWaitOptions{Condition: container.WaitConditionNextExit})
			select {
			case res := <-w.Result:
				if res.StatusCode != c.want || res.Error != nil || f.inspects != c.inspects {
					t.Errorf("status %d (%v) after %d inspections; want %d after %d", res.StatusCode, res.Error, f.inspects, c.want, c.inspects)
				}
			case err := <-w.Error:
				t.Errorf("wait failed: %v", err)
			}
			if c.name == "running" && f.conditions[1] != container.WaitConditionNotRunning {
				t.Errorf("waited again for %q, want not-running", f.conditions[1])
			}
		})
	}
}

// waiter is an engine whose first wait fails (when fail), and whose next
// says exit status 3.
type waiter struct {
	client.APIClient
	state      container.State
	fail       bool
	inspects   int
	conditions []container.WaitCondition
}

func (f *waiter) ContainerWait(_ context.Context, _ string, o client.ContainerWaitOptions) client.ContainerWaitResult {
	f.conditions = append(f.conditions, o.Condition)
	res, errC := make(chan container.WaitResponse, 1), make(chan error, 1)
	switch {
	case len(f.conditions) == 1 && f.fail:
		res <- container.WaitResponse{Error: &container.WaitExitError{Message: "the wait broke"}}
	case len(f.conditions) == 1:
		res <- container.WaitResponse{StatusCode: 0}
	default:
		res <- container.WaitResponse{StatusCode: 3}
	}
	return client.ContainerWaitResult{Result: res, Error: errC}
}

func (f *waiter) ContainerInspect(context.Context, string, client.ContainerInspectOptions) (client.ContainerInspectResult, error) {
	f.inspects++
	var res client.ContainerInspectResult
	st := f.state
	res.Container.State = &st
	return res, nil
}
