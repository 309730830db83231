//go:build !linux

package e2e

import "syscall"

// freeBind does nothing where there is no IP_FREEBIND: the address must be
// the host's already.
func freeBind(_, _ string, _ syscall.RawConn) error { return nil }
