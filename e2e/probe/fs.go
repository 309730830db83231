package main

import (
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// fsOps runs file operations in order, each one argument of words:
//
//	write PATH TEXT      create or truncate PATH with TEXT
//	writehex PATH HEX    create or truncate PATH with the bytes HEX says (binary content)
//	append PATH TEXT     add TEXT to the end of PATH
//	mkdir PATH           make a directory (0755), and its parents
//	rm PATH              remove a file, symbolic link or empty directory
//	rmrf PATH            remove PATH and everything below it
//	mv FROM TO           rename
//	chmod MODE PATH      set the mode bits (octal, setuid/setgid/sticky included)
//	cpr FROM TO          copy FROM (a file, or a directory and all below it) to TO
//	symlink TARGET PATH  make a symbolic link
//	mkfifo PATH          make a named pipe (FIFO)
//	sleep DURATION       wait (printing "sleeping" first)
//
// It prints "done N" after N operations, or fails at the first that fails.
func fsOps(ops []string) {
	for i, op := range ops {
		words := strings.SplitN(op, " ", 3)
		arg := func(n int) string {
			if len(words) <= n {
				fail(fmt.Errorf("operation %d %q: missing argument", i+1, op))
			}
			return words[n]
		}
		var err error
		switch words[0] {
		case "write":
			err = os.WriteFile(arg(1), []byte(arg(2)), 0o644)
		case "writehex":
			var b []byte
			if b, err = hex.DecodeString(arg(2)); err == nil {
				err = os.WriteFile(arg(1), b, 0o644)
			}
		case "append":
			var f *os.File
			if f, err = os.OpenFile(arg(1), os.O_WRONLY|os.O_APPEND, 0); err == nil {
				_, err = f.WriteString(arg(2))
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
		case "mkdir":
			err = os.MkdirAll(arg(1), 0o755)
		case "rm":
			err = os.Remove(arg(1))
		case "rmrf":
			err = os.RemoveAll(arg(1))
		case "mv":
			err = os.Rename(arg(1), arg(2))
		case "chmod":
			var m uint64
			if m, err = strconv.ParseUint(arg(1), 8, 32); err == nil {
				err = unix.Chmod(arg(2), uint32(m))
			}
		case "cpr":
			err = copyTree(arg(1), arg(2))
		case "symlink":
			err = os.Symlink(arg(1), arg(2))
		case "mkfifo":
			err = unix.Mkfifo(arg(1), 0o644)
		case "sleep":
			var d time.Duration
			if d, err = time.ParseDuration(arg(1)); err == nil {
				fmt.Println("sleeping")
				time.Sleep(d)
			}
		default:
			err = fmt.Errorf("unknown operation %q", words[0])
		}
		if err != nil {
			fail(fmt.Errorf("operation %d %q: %w", i+1, op, err))
		}
	}
	fmt.Printf("done %d\n", len(ops))
}

// copyTree copies files, directories and symbolic links from src to dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(to, info.Mode().Perm())
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, data, info.Mode().Perm())
	})
}
