package fsutil

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// maxSocketPath is the longest path a unix socket address holds (Linux:
// 108 bytes with the final NUL).
const maxSocketPath = 107

// DialUnix connects to the unix socket name in dir. A path too long for a
// socket address (a deep $XDG_STATE_HOME or $XDG_RUNTIME_DIR) is reached
// through the directory's descriptor, /proc/self/fd/N/NAME, where there is
// a /proc.
func DialUnix(ctx context.Context, dir, name string) (net.Conn, error) {
	var d net.Dialer
	sock := filepath.Join(dir, name)
	if len(sock) <= maxSocketPath {
		return d.DialContext(ctx, "unix", sock)
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d/%s", f.Fd(), name))
}

// ListenUnix listens on the unix socket name in dir, with mode perm; a
// socket of that name left there is replaced. A path too long for a socket
// address is reached as DialUnix does. The socket stays when the listener
// is closed.
func ListenUnix(dir, name string, perm os.FileMode) (net.Listener, error) {
	path := filepath.Join(dir, name)
	os.Remove(path)
	addr := path
	if len(path) > maxSocketPath {
		d, err := os.Open(dir)
		if err != nil {
			return nil, err
		}
		defer d.Close()
		addr = fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), name)
	}
	l, err := net.Listen("unix", addr)
	if err != nil {
		return nil, err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(path, perm); err != nil {
		l.Close()
		return nil, errors.Join(err, os.Remove(path))
	}
	return l, nil
}
