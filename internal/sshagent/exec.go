package sshagent

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// Runner runs host commands.
type Runner interface {
	// Output runs a command to completion and returns its standard output.
	// It must return soon after ctx is done: Setup and Cleanup bound their
	// commands by cancelling ctx.
	Output(ctx context.Context, name string, args ...string) ([]byte, error)
	// Start starts a long-running command. ctx bounds only the starting.
	Start(ctx context.Context, name string, args ...string) (Process, error)
}

// Process is a started command. Wait is called once.
type Process interface {
	Kill() error
	Wait() error
}

// Clock is the time Setup and Cleanup wait on.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// SystemClock is the real Clock.
type SystemClock struct{}

func (SystemClock) Now() time.Time                         { return time.Now() }
func (SystemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// ExecRunner is the real Runner, with os/exec. Commands read no standard
// input; their standard error ends up in the errors.
type ExecRunner struct{}

// waitDelay bounds how long Output waits for a killed command's pipes.
const waitDelay = time.Second

func (ExecRunner) Output(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = waitDelay
	var stderr tail
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, commandError(name, err, &stderr)
	}
	return out, nil
}

func (ExecRunner) Start(ctx context.Context, name string, args ...string) (Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Not CommandContext: the process outlives the ctx that starts it.
	cmd := exec.Command(name, args...)
	p := &execProcess{name: name, cmd: cmd}
	cmd.Stderr = &p.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return p, nil
}

type execProcess struct {
	name   string
	cmd    *exec.Cmd
	stderr tail
}

func (p *execProcess) Kill() error { return p.cmd.Process.Kill() }

func (p *execProcess) Wait() error {
	if err := p.cmd.Wait(); err != nil {
		return commandError(p.name, err, &p.stderr)
	}
	return nil
}

func commandError(name string, err error, stderr *tail) error {
	if msg := strings.TrimSpace(stderr.String()); msg != "" {
		return fmt.Errorf("%s: %w: %s", name, err, msg)
	}
	return fmt.Errorf("%s: %w", name, err)
}

// tail keeps the last 4 KiB written to it.
type tail struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

const tailMax = 4 << 10

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - tailMax; over > 0 {
		t.buf.Next(over)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}
