package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/engine"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// TestExec runs commands in a running sandbox's container: what they read
// and write goes through the streams given, their exit code comes back
// (one above zero is no error), and a service that does not run is an
// error. The sandbox itself runs with its output on streams of its own.
func TestExec(t *testing.T) {
	ctx := context.Background()
	eng := connectEngine(t)
	name := fmt.Sprintf("propio-test-exec-%d", time.Now().UnixNano())
	t.Cleanup(func() { eng.Remove(context.Background(), name, 0) })
	svc := types.ServiceConfig{Name: "agent"}
	svc.Image, svc.Command, svc.NetworkMode = testenv.ProbeImage, types.ShellCommand{"sleep", "60s"}, "none"
	svc.Labels = types.Labels{engine.LabelProject: name}
	project := &types.Project{Name: name, Services: types.Services{"agent": svc}}

	var out testenv.Buffer
	type result struct {
		code int
		err  error
	}
	ran := make(chan result, 1)
	go func() {
		code, err := eng.Run(ctx, project, backend.RunSpec{Service: "agent", Streams: backend.Streams{Out: &out, Err: &out}})
		ran <- result{code, err}
	}()
	deadline := time.After(60 * time.Second)
	for !strings.Contains(out.String(), "ready") {
		select {
		case r := <-ran:
			t.Fatalf("the sandbox ended before it was ready: %d, %v; its output: %q", r.code, r.err, out.String())
		case <-deadline:
			t.Fatalf("the sandbox's output on its own streams never said ready: %q", out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}

	// The output can come before the engine has marked the container
	// running (a loaded machine shows it): exec needs it running.
	for running := false; !running; {
		list, err := eng.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range list {
			running = running || sb.Project == name && sb.State == "running"
		}
		if !running {
			select {
			case <-deadline:
				t.Fatalf("the engine never listed %s running: %+v", name, list)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}

	var catOut bytes.Buffer
	code, err := eng.Exec(ctx, name, backend.ExecSpec{
		Service:     "agent",
		Command:     []string{"/probe", "cat"},
		Interactive: true,
		Streams:     backend.Streams{In: strings.NewReader("hello from the host\n"), Out: &catOut, Err: &catOut},
	})
	if err != nil || code != 0 || catOut.String() != "hello from the host\n" {
		t.Errorf("exec cat = %d, %v, output %q; want 0, nil, what it read", code, err, catOut.String())
	}
	var exitOut bytes.Buffer
	code, err = eng.Exec(ctx, name, backend.ExecSpec{Service: "agent", Command: []string{"/probe", "exit", "3"}, Streams: backend.Streams{Out: &exitOut, Err: &exitOut}})
	if err != nil || code != 3 {
		t.Errorf("exec exit 3 = %d, %v; want 3, nil", code, err)
	}
	if _, err := eng.Exec(ctx, name, backend.ExecSpec{Service: "nosuch", Command: []string{"/probe", "id"}, Streams: backend.Streams{Out: &exitOut, Err: &exitOut}}); err == nil {
		t.Error("exec in a service that does not run: no error")
	}

	if err := eng.Kill(ctx, name); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
	case <-time.After(60 * time.Second):
		t.Fatal("the sandbox did not end once killed")
	}
	if err := eng.Remove(ctx, name, 0); err != nil {
		t.Fatal(err)
	}
	if left, _ := testenv.Docker("ps", "-aq", "--filter", "label="+engine.LabelProject+"="+name); strings.TrimSpace(left) != "" {
		t.Errorf("containers left: %s", left)
	}
}
