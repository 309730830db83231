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
//	fill PATH SIZE       create or truncate PATH with SIZE bytes (512k, 300m, 2g) of
//	                     non-zero data, 1 MiB a write, synced; prints "filled PATH N" with N the bytes written
//	hold PATH SIZE       create PATH and delete it, then fill it, keeping it open until the probe
//	                     exits: space no walk of the tree can see
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
		case "fill", "hold":
			var n int64
			if n, err = parseSize(arg(2)); err == nil {
				err = fillFile(arg(1), n, words[0] == "hold")
			}
		case "trickle":
			var n int64
			if n, err = parseSize(arg(2)); err == nil {
				err = trickleFile(arg(1), n)
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

// parseSize reads a byte count with an optional k, m or g suffix (powers of 1024).
func parseSize(s string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "k"):
		mult = 1 << 10
	case strings.HasSuffix(s, "m"):
		mult = 1 << 20
	case strings.HasSuffix(s, "g"):
		mult = 1 << 30
	}
	n, err := strconv.ParseInt(strings.TrimRight(s, "kmg"), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size", s)
	}
	return n * mult, nil
}

// held are the files hold keeps open, deleted, until the probe exits.
var held []*os.File

// fillFile writes n bytes of non-zero data to path (which file systems
// cannot keep sparse), and syncs it, so that its blocks are allocated when
// it returns. It prints how much it wrote, even when a write fails. With
// hold, it deletes the file before it writes, and keeps it open. On a
// failure the file is left open (the probe exits at once).
// trickleFile writes n bytes to path, 1 MiB at a time at most 50 MiB a
// second: a writer that something must stop, slow enough for a test to
// see that it was stopped before it got far.
func trickleFile(path string, n int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Println("trickling")
	buf := []byte(strings.Repeat("propio-sandbox fills this file.\n", 1<<15)) // 1 MiB
	for done := int64(0); done < n; done += int64(len(buf)) {
		if _, err := f.Write(buf[:min(int64(len(buf)), n-done)]); err != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Printf("trickled %s %d\n", path, n)
	return nil
}

func fillFile(path string, n int64, hold bool) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if hold {
		// Deleted before a byte is written: no walk ever sees it.
		if err := os.Remove(path); err != nil {
			f.Close()
			return err
		}
		held = append(held, f)
	}
	buf := []byte(strings.Repeat("propio-sandbox fills this file.\n", 1<<15)) // 1 MiB
	var done int64
	for done < n {
		chunk := buf[:min(int64(len(buf)), n-done)]
		w, err := f.Write(chunk)
		done += int64(w)
		if err != nil {
			fmt.Printf("filled %s %d\n", path, done)
			return err
		}
	}
	if err := f.Sync(); err != nil {
		fmt.Printf("filled %s %d\n", path, done)
		return err
	}
	fmt.Printf("filled %s %d\n", path, done)
	if hold {
		return nil
	}
	return f.Close()
}
