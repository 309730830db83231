// Package netfence fences a network namespace in: a firewall (nftables,
// in that namespace's own kernel tables) that lets its processes reach only
// loopback and one address, the allowlist gateway's, and be reached only
// from them. It is how a sandbox on an engine whose internal networks do
// not keep the host out (Podman: the host has an address on each, and
// serves DNS there) gets Docker's guarantee: a container that holds the
// namespace (with CAP_NET_ADMIN there, and nothing else) fences it before
// the agent's container joins it; the agent has no capability to change
// the fence.
//
// It imports nothing of this module; it never prints.
package netfence

import "errors"

// TableName is the nftables table of the fence.
const TableName = "propio-sandbox-fence"

// ErrNotFenced: the namespace has no fence (Check).
var ErrNotFenced = errors.New("the network namespace is not fenced")
