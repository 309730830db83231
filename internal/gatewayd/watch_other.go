//go:build !linux

package gatewayd

import (
	"context"
	"errors"
)

// watchDir is Linux's (the gateway runs in a Linux container).
func watchDir(context.Context, string, string, func()) error {
	return errors.New("watching a directory needs Linux")
}
