//go:build linux

package testenv

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// OpenPTY opens a new pseudo-terminal pair, 24×80, the master pollable so
// that reads can have deadlines.
func OpenPTY(t testing.TB) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	var n uint32
	var ioerr error
	err = Control(master, func(fd int) {
		if ioerr = unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); ioerr != nil {
			return
		}
		n, ioerr = unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	})
	if err = errors.Join(err, ioerr); err != nil {
		master.Close()
		t.Fatalf("setting up /dev/ptmx: %v", err)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		master.Close()
		t.Fatalf("opening the terminal: %v", err)
	}
	err = Control(master, func(fd int) {
		ioerr = unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: 24, Col: 80})
	})
	if err = errors.Join(err, ioerr); err != nil {
		t.Fatalf("setting the terminal size: %v", err)
	}
	return master, slave
}

// Control runs fn on f's descriptor without making it blocking (as Fd would),
// so that deadlines keep working.
func Control(f *os.File, fn func(fd int)) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(func(fd uintptr) { fn(int(fd)) })
}
