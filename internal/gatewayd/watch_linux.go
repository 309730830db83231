package gatewayd

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// watchDir calls fn each time a file named name is moved into dir or
// written there and closed, until ctx ends. It returns once the watch is
// set up.
func watchDir(ctx context.Context, dir, name string, fn func()) error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("watching %s: %w", dir, err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE); err != nil {
		unix.Close(fd)
		return fmt.Errorf("watching %s: %w", dir, err)
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: reads wait in the runtime's poller
	go func() {
		<-ctx.Done()
		f.Close()
	}()
	go func() {
		buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
		for {
			n, err := f.Read(buf)
			if err != nil {
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				var ev unix.InotifyEvent
				_ = binary.Read(bytes.NewReader(buf[off:off+unix.SizeofInotifyEvent]), binary.NativeEndian, &ev)
				nameBytes := buf[off+unix.SizeofInotifyEvent : min(n, off+unix.SizeofInotifyEvent+int(ev.Len))]
				off += unix.SizeofInotifyEvent + int(ev.Len)
				if string(bytes.TrimRight(nameBytes, "\x00")) == name {
					fn()
				}
			}
		}
	}()
	return nil
}
