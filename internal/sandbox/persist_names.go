package sandbox

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"time"
)

// claimExact takes the project name name, as claimName takes one, and no
// other: up --name. It fails when another launcher of this host holds it,
// or taken says the engine has a sandbox of it.
func claimExact(dir, name string, taken func(string) bool) (string, func(), error) {
	f, err := openLock(filepath.Join(dir, name+".lock"))
	if err != nil {
		return "", nil, fmt.Errorf("taking the sandbox's name: %w", err)
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err == nil && !taken(name) {
		return name, func() { f.Close() }, nil
	}
	f.Close()
	if err == nil || errors.Is(err, syscall.EWOULDBLOCK) {
		return "", nil, &ExistsError{Name: nameOf(name), State: "held by another sandbox", Workspace: "another launcher"}
	}
	return "", nil, fmt.Errorf("taking the sandbox's name: %w", err)
}

// nameWait bounds the wait for a persistent sandbox's own name, which a
// launcher looking for a free name may hold for a moment.
const nameWait = 30 * time.Second

// holdName takes the project name name, which is a persistent sandbox's
// own (start, down), waiting a bounded time for a launcher that holds it
// for a moment (one that looks at it and goes on to NAME-2).
func holdName(dir, name string) (string, func(), error) {
	f, err := openLock(filepath.Join(dir, name+".lock"))
	if err != nil {
		return "", nil, fmt.Errorf("taking the sandbox's name: %w", err)
	}
	locked := make(chan error, 1)
	go func() { locked <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-locked:
		if err != nil {
			f.Close()
			return "", nil, fmt.Errorf("taking the sandbox's name: %w", err)
		}
		return name, func() { f.Close() }, nil
	case <-time.After(nameWait):
		// The lock, if it is ever taken, goes with the file.
		f.Close()
		return "", nil, fmt.Errorf("taking the name %s: another launcher has held it for %s", name, nameWait)
	}
}
