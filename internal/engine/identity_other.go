//go:build !linux

package engine

// daemonIdentity: the engine process cannot be named here; its info is
// always read.
func daemonIdentity(string) string { return "" }
