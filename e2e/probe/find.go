package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
)

// find reads every file reachable below dir, following symbolic links as an
// agent would (each directory once), and prints "found PATH" for each whose
// content holds text, then "searched N files". Entries it cannot read are
// skipped: what cannot be read leaks nothing.
func find(args []string) {
	need(args, 2)
	text, root := []byte(args[0]), args[1]
	seen := map[[2]uint64]bool{}
	files := 0
	var walk func(dir string)
	walk = func(dir string) {
		st, err := os.Stat(dir)
		if err != nil {
			return
		}
		if s, ok := st.Sys().(*syscall.Stat_t); ok {
			id := [2]uint64{uint64(s.Dev), s.Ino}
			if seen[id] {
				return
			}
			seen[id] = true
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		names := make([]string, len(entries))
		for i, e := range entries {
			names[i] = e.Name()
		}
		sort.Strings(names)
		for _, name := range names {
			p := filepath.Join(dir, name)
			st, err := os.Stat(p) // through links
			switch {
			case err != nil:
			case st.IsDir():
				walk(p)
			case st.Mode().IsRegular():
				files++
				if data, err := os.ReadFile(p); err == nil && bytes.Contains(data, text) {
					fmt.Println("found", p)
				}
			}
		}
	}
	walk(root)
	fmt.Printf("searched %d files\n", files)
}
