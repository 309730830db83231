package e2e

import (
	"errors"
	"syscall"
)

// freeBind lets a socket bind an address the host does not have yet
// (IP_FREEBIND), for net.ListenConfig's Control.
func freeBind(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_IP, syscall.IP_FREEBIND, 1) })
	return errors.Join(err, serr)
}
