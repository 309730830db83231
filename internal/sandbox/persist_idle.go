package sandbox

import (
	"os"
	"syscall"
	"time"
)

// idleWatch closes expired once a persistent sandbox has been idle for
// after: no exec runs in it (none holds the busy file's lock, shared) and
// none has started or ended (each touches the file then) for that long.
// It then holds the lock, exclusive, for the rest of the supervisor's life:
// an exec that comes meanwhile waits, and finds the sandbox gone.
type idleWatch struct {
	path    string
	after   time.Duration
	expired chan struct{}
	done    chan struct{}
	held    *os.File // the lock, once expired
}

// newIdleWatch watches path; after zero watches nothing (idle: off).
func newIdleWatch(path string, after time.Duration) *idleWatch {
	w := &idleWatch{path: path, after: after, expired: make(chan struct{}), done: make(chan struct{})}
	if after > 0 {
		go w.run()
	}
	return w
}

func (w *idleWatch) stop() { close(w.done) }

func (w *idleWatch) run() {
	timer := time.NewTimer(w.after)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-w.done:
			return
		}
		f, free, err := lockExclusive(w.path)
		switch {
		case err != nil:
			timer.Reset(w.after)
		case !free:
			// Commands run: a whole idle period from when the last ends.
			if !w.waitFree() {
				return
			}
			timer.Reset(w.after)
		default:
			st, err := f.Stat()
			if since := time.Since(st.ModTime()); err == nil && since < w.after {
				f.Close()
				timer.Reset(w.after - since)
				continue
			}
			w.held = f // until the supervisor ends
			close(w.expired)
			return
		}
	}
}

// waitFree waits until no exec holds the lock; false when the watch stops
// first.
func (w *idleWatch) waitFree() bool {
	f, err := os.OpenFile(w.path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return true
	}
	free := make(chan struct{})
	go func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		f.Close()
		close(free)
	}()
	select {
	case <-free:
		return true
	case <-w.done:
		return false
	}
}
