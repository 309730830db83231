package fsutil

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// NotRegularError is a path that names something other than a regular file:
// a FIFO, a device, a socket or a directory. Reading a FIFO blocks until a
// writer comes, and opening a device can have effects of its own, so files
// that a sandbox could have made are refused at once instead.
type NotRegularError struct {
	Path string
	Kind string // "a FIFO (named pipe)", "a device", "a socket", "a directory", ...
}

func (e *NotRegularError) Error() string {
	return fmt.Sprintf("%s is %s, not a regular file", e.Path, e.Kind)
}

// Kind names the type of a file that is not regular: "a FIFO (named
// pipe)", "a directory", ...
func Kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO (named pipe)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "not a plain file (" + m.Type().String() + ")"
}

// OpenRegular opens path for reading only when it is a regular file, and
// never blocks doing so. It looks first (stat, following links) and refuses
// anything else without opening it; then it opens with O_NONBLOCK, so that
// a file swapped for a FIFO in between does not hold the open, and checks
// the open file again. Errors: *NotRegularError, or the *fs.PathError of
// stat or open (fs.ErrNotExist, fs.ErrPermission, ELOOP for a link loop).
func OpenRegular(path string) (*os.File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, &NotRegularError{Path: path, Kind: Kind(st.Mode())}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	st, err = f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, &NotRegularError{Path: path, Kind: Kind(st.Mode())}
	}
	return f, nil
}

// ErrTooLarge is returned (wrapped) by ReadRegular for a file above its bound.
var ErrTooLarge = errors.New("file is too large")

// ReadRegular reads a whole regular file, opened as OpenRegular does, of at
// most max bytes.
func ReadRegular(path string, max int64) ([]byte, error) {
	f, err := OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, &tooLarge{path: path, max: max}
	}
	return data, nil
}

type tooLarge struct {
	path string
	max  int64
}

func (e *tooLarge) Error() string { return fmt.Sprintf("%s is larger than %d bytes", e.path, e.max) }
func (e *tooLarge) Unwrap() error { return ErrTooLarge }

// Problem says in a few words why a file could not be read, for a message
// that names the file itself: "is a FIFO (named pipe), not a regular file",
// "is a symbolic link loop", "does not exist", "cannot be read: permission
// denied".
func Problem(err error) string {
	var nr *NotRegularError
	var big *tooLarge
	switch {
	case errors.As(err, &big):
		return fmt.Sprintf("is larger than %d bytes", big.max)
	case errors.As(err, &nr):
		return "is " + nr.Kind + ", not a regular file"
	case errors.Is(err, syscall.ELOOP):
		return "is a symbolic link loop (too many levels of symbolic links)"
	case errors.Is(err, fs.ErrNotExist):
		return "does not exist"
	case errors.Is(err, syscall.ENOTDIR):
		return "does not exist (a part of its path is not a directory)"
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return "cannot be read: " + pe.Err.Error()
	}
	return "cannot be read: " + err.Error()
}
