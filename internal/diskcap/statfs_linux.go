package diskcap

import (
	"fmt"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// Used is the space in use on the file system that holds path, in bytes.
func Used(path string) (int64, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return 0, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	size := s.Frsize
	if size == 0 {
		size = s.Bsize
	}
	return int64(s.Blocks-s.Bfree) * size, nil
}

// FSType names the type of the file system that holds path.
func FSType(path string) string {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return "its file system"
	}
	switch s.Type {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	case unix.NFS_SUPER_MAGIC:
		return "nfs"
	case unix.FUSE_SUPER_MAGIC:
		return "fuse"
	case 0x2fc12fc1:
		return "zfs"
	}
	return fmt.Sprintf("a file system of type %#x", s.Type)
}

// lowPriority runs f on an OS thread at nice 19 that runs nothing else.
//
// Such a thread is never let go: its goroutine stays locked to it, and
// waits for the next f. A thread cannot be given back to the runtime (a
// process that is not privileged cannot raise its priority again), and a
// thread that ends kills the children it started with a parent-death
// signal: the thread may have run other goroutines before it was locked,
// and the docker CLI's ssh helper starts one ssh process per connection to
// the engine with SIGKILL as its parent-death signal, so a walk's thread
// that ended would kill an ssh under a request of the launch (the engine's
// answer lost: "ssh ... has exited with signal: killed"). Walks that run
// at once each have a thread: the process keeps as many as ever ran at
// once.
func lowPriority(f func()) {
	w := lowThreads.get()
	done := make(chan struct{})
	w <- func() {
		defer close(done)
		f()
	}
	<-done
	lowThreads.put(w)
}

// lowThreads are the idle threads at nice 19, each a goroutine locked to
// it that runs the functions sent to it.
var lowThreads threadPool

type threadPool struct {
	mu   sync.Mutex
	idle []chan func()
}

// get is an idle thread of the pool, or a new one.
func (p *threadPool) get() chan func() {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		w := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return w
	}
	p.mu.Unlock()
	w := make(chan func())
	go func() {
		runtime.LockOSThread() // for good: see lowPriority
		// Best effort: at worst the walks run at the launcher's priority.
		unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19)
		for f := range w {
			f()
		}
	}()
	return w
}

// put gives a thread that has finished its function back to the pool.
func (p *threadPool) put(w chan func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.idle = append(p.idle, w)
}
