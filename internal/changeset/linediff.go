package changeset

import (
	"bytes"
	"fmt"
	"io"
)

// opKind is one step of an edit script.
type opKind byte

const (
	opEqual  opKind = ' '
	opDelete opKind = '-'
	opInsert opKind = '+'
)

// edit is one line of an edit script: a line of a (opEqual, opDelete) at
// index A, or of b (opInsert) at index B. For opEqual both are set.
type edit struct {
	Op   opKind
	A, B int
}

// maxEditDistance bounds Myers' search: past it the differing middle (after
// the common start and end are cut off) is shown as removed then added,
// which is a correct, if not the shortest, diff. It keeps memory at a few
// tens of megabytes for any input.
const maxEditDistance = 2000

// splitLines cuts data into lines, each keeping its "\n" (the last may lack one).
func splitLines(data []byte) [][]byte {
	var lines [][]byte
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			lines = append(lines, data)
			break
		}
		lines = append(lines, data[:i+1])
		data = data[i+1:]
	}
	return lines
}

// lineDiff returns a shortest edit script from a to b (Myers 1986, "An
// O(ND) difference algorithm"), after cutting off the lines both start and
// end with.
func lineDiff(a, b [][]byte) []edit {
	// Lines become small integers, so the search compares ints.
	ids := map[string]int{}
	intern := func(lines [][]byte) []int {
		out := make([]int, len(lines))
		for i, l := range lines {
			id, ok := ids[string(l)]
			if !ok {
				id = len(ids)
				ids[string(l)] = id
			}
			out[i] = id
		}
		return out
	}
	x, y := intern(a), intern(b)
	pre := 0
	for pre < len(x) && pre < len(y) && x[pre] == y[pre] {
		pre++
	}
	suf := 0
	for suf < len(x)-pre && suf < len(y)-pre && x[len(x)-1-suf] == y[len(y)-1-suf] {
		suf++
	}
	var out []edit
	for i := range pre {
		out = append(out, edit{opEqual, i, i})
	}
	mid := myers(x[pre:len(x)-suf], y[pre:len(y)-suf])
	for _, e := range mid {
		e.A += pre
		e.B += pre
		out = append(out, e)
	}
	for i := range suf {
		out = append(out, edit{opEqual, len(x) - suf + i, len(y) - suf + i})
	}
	return out
}

// myers is the greedy forward search, keeping the frontier of each round
// for the walk back.
func myers(a, b []int) []edit {
	n, m := len(a), len(b)
	if n == 0 || m == 0 {
		return replaceAll(n, m)
	}
	limit := min(n+m, maxEditDistance)
	off := limit + 1
	v := make([]int32, 2*limit+3)
	// trace[d] holds v[-(d-1)..d-1] as round d started.
	var trace [][]int32
	for d := 0; d <= limit; d++ {
		if d > 0 {
			trace = append(trace, append([]int32(nil), v[off-(d-1):off+d]...))
		} else {
			trace = append(trace, nil)
		}
		for k := -d; k <= d; k += 2 {
			var xx int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				xx = int(v[off+k+1])
			} else {
				xx = int(v[off+k-1]) + 1
			}
			yy := xx - k
			for xx < n && yy < m && a[xx] == b[yy] {
				xx++
				yy++
			}
			v[off+k] = int32(xx)
			if xx >= n && yy >= m {
				return backtrack(trace, d, n, m)
			}
		}
	}
	return replaceAll(n, m)
}

func backtrack(trace [][]int32, dEnd, n, m int) []edit {
	var rev []edit
	x, y := n, m
	for d := dEnd; d > 0; d-- {
		snap := trace[d]
		get := func(k int) int { return int(snap[k+(d-1)]) }
		k := x - y
		var prevK int
		if k == -d || (k != d && get(k-1) < get(k+1)) {
			prevK = k + 1
		} else {
			prevK = k - 1
		}
		prevX := get(prevK)
		prevY := prevX - prevK
		for x > prevX && y > prevY {
			x--
			y--
			rev = append(rev, edit{opEqual, x, y})
		}
		if x == prevX {
			y--
			rev = append(rev, edit{opInsert, x, y})
		} else {
			x--
			rev = append(rev, edit{opDelete, x, y})
		}
	}
	for x > 0 && y > 0 {
		x--
		y--
		rev = append(rev, edit{opEqual, x, y})
	}
	out := make([]edit, len(rev))
	for i, e := range rev {
		out[len(rev)-1-i] = e
	}
	return out
}

func replaceAll(n, m int) []edit {
	out := make([]edit, 0, n+m)
	for i := range n {
		out = append(out, edit{opDelete, i, 0})
	}
	for j := range m {
		out = append(out, edit{opInsert, n, j})
	}
	return out
}

// counts is the number of lines added and removed by an edit script.
func counts(es []edit) (added, removed int) {
	for _, e := range es {
		switch e.Op {
		case opInsert:
			added++
		case opDelete:
			removed++
		}
	}
	return
}

// writeHunks writes the edit script as unified diff hunks with ctx lines
// of context around each change.
func writeHunks(w io.Writer, a, b [][]byte, es []edit, ctx int) error {
	// Group the changes: a hunk spans from ctx lines before a change to
	// ctx lines after the last change that is within 2*ctx of the next.
	i := 0
	for i < len(es) {
		for i < len(es) && es[i].Op == opEqual {
			i++
		}
		if i == len(es) {
			break
		}
		start := max(i-ctx, 0)
		end := i // one past the last change of the hunk
		for j := i; j < len(es); j++ {
			if es[j].Op != opEqual {
				end = j + 1
				continue
			}
			if j-end >= 2*ctx {
				break
			}
		}
		stop := min(end+ctx, len(es))
		if err := writeHunk(w, a, b, es[start:stop]); err != nil {
			return err
		}
		i = stop
	}
	return nil
}

func writeHunk(w io.Writer, a, b [][]byte, es []edit) error {
	aStart, bStart := -1, -1
	aLen, bLen := 0, 0
	for _, e := range es {
		if e.Op != opInsert {
			if aStart < 0 {
				aStart = e.A
			}
			aLen++
		}
		if e.Op != opDelete {
			if bStart < 0 {
				bStart = e.B
			}
			bLen++
		}
	}
	// An empty side starts at the line before the hunk (0 at the top).
	if aStart < 0 {
		aStart = es[0].A - 1
	}
	if bStart < 0 {
		bStart = es[0].B - 1
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "@@ -%s +%s @@\n", hunkRange(aStart, aLen), hunkRange(bStart, bLen))
	for _, e := range es {
		var line []byte
		switch e.Op {
		case opInsert:
			line = b[e.B]
		default:
			line = a[e.A]
		}
		buf.WriteByte(byte(e.Op))
		buf.Write(line)
		if len(line) == 0 || line[len(line)-1] != '\n' {
			buf.WriteString("\n\\ No newline at end of file\n")
		}
	}
	_, err := w.Write(buf.Bytes())
	return err
}

func hunkRange(start, n int) string {
	if n == 1 {
		return fmt.Sprint(start + 1)
	}
	return fmt.Sprintf("%d,%d", start+1, n)
}
