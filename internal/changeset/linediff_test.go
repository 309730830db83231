package changeset

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func lines(s string) [][]byte { return splitLines([]byte(s)) }

// lcs is the length of the longest common subsequence, by dynamic programming.
func lcs(a, b [][]byte) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			if bytes.Equal(a[i-1], b[j-1]) {
				cur[j] = prev[j-1] + 1
			} else {
				cur[j] = max(prev[j], cur[j-1])
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// replay rebuilds both sides from an edit script.
func replay(a, b [][]byte, es []edit) (gotA, gotB []byte) {
	for _, e := range es {
		switch e.Op {
		case opEqual:
			gotA = append(gotA, a[e.A]...)
			gotB = append(gotB, b[e.B]...)
		case opDelete:
			gotA = append(gotA, a[e.A]...)
		case opInsert:
			gotB = append(gotB, b[e.B]...)
		}
	}
	return
}

func randomText(r *rand.Rand, n int) string {
	var b strings.Builder
	for range n {
		fmt.Fprintf(&b, "%c\n", 'a'+rune(r.IntN(4)))
	}
	if r.IntN(4) == 0 {
		b.WriteString("no newline")
	}
	return b.String()
}

func mutate(r *rand.Rand, s string) string {
	ls := strings.SplitAfter(s, "\n")
	for range r.IntN(6) {
		i := r.IntN(len(ls) + 1)
		switch r.IntN(3) {
		case 0:
			if i < len(ls) {
				ls = append(ls[:i], ls[i+1:]...)
			}
		case 1:
			ls = append(ls[:i], append([]string{fmt.Sprintf("new %d\n", r.IntN(100))}, ls[i:]...)...)
		case 2:
			if i < len(ls) {
				ls[i] = "changed\n"
			}
		}
	}
	return strings.Join(ls, "")
}

// TestLineDiffMinimal checks on random inputs that the edit script
// rebuilds both sides and is as short as the longest common subsequence allows.
func TestLineDiffMinimal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		sa := randomText(r, r.IntN(30))
		sb := mutate(r, sa)
		if i%3 == 0 {
			sb = randomText(r, r.IntN(30))
		}
		a, b := lines(sa), lines(sb)
		es := lineDiff(a, b)
		gotA, gotB := replay(a, b, es)
		if string(gotA) != sa || string(gotB) != sb {
			t.Fatalf("case %d: the script does not rebuild the inputs\na=%q\nb=%q", i, sa, sb)
		}
		added, removed := counts(es)
		if want := len(a) + len(b) - 2*lcs(a, b); added+removed != want {
			t.Fatalf("case %d: %d edits, the shortest has %d\na=%q\nb=%q", i, added+removed, want, sa, sb)
		}
	}
}

// TestLineDiffLimit: past maxEditDistance the diff is still correct.
func TestLineDiffLimit(t *testing.T) {
	var sa, sb strings.Builder
	for i := range 3000 {
		fmt.Fprintf(&sa, "a%d\n", i)
		fmt.Fprintf(&sb, "b%d\n", i)
	}
	a, b := lines(sa.String()), lines(sb.String())
	es := lineDiff(a, b)
	gotA, gotB := replay(a, b, es)
	if string(gotA) != sa.String() || string(gotB) != sb.String() {
		t.Fatal("the script does not rebuild the inputs")
	}
	if added, removed := counts(es); added != 3000 || removed != 3000 {
		t.Errorf("+%d -%d", added, removed)
	}
}

func TestHunks(t *testing.T) {
	cases := []struct{ name, a, b, want string }{
		{"empty to one", "", "x\n", "@@ -0,0 +1 @@\n+x\n"},
		{"one to empty", "x\n", "", "@@ -1 +0,0 @@\n-x\n"},
		{"no newline", "x", "x\n", "@@ -1 +1 @@\n-x\n\\ No newline at end of file\n+x\n"},
		{"middle", "1\n2\n3\n4\n5\n6\n7\n8\n9\n", "1\n2\n3\n4\nfive\n6\n7\n8\n9\n", "@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"},
		{"insert at top", "1\n2\n3\n4\n5\n", "0\n1\n2\n3\n4\n5\n", "@@ -1,3 +1,4 @@\n+0\n 1\n 2\n 3\n"},
		{"joined", "1\n2\n3\n4\n5\n6\n7\n8\n", "x\n2\n3\n4\n5\n6\n7\ny\n", "@@ -1,8 +1,8 @@\n-1\n+x\n 2\n 3\n 4\n 5\n 6\n 7\n-8\n+y\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := lines(tc.a), lines(tc.b)
			var buf bytes.Buffer
			writeHunks(&buf, a, b, lineDiff(a, b), 3)
			if buf.String() != tc.want {
				t.Errorf("got\n%s\nwant\n%s", buf.String(), tc.want)
			}
		})
	}
}

// TestHunksApplyWithPatch: patch(1) turns a into b with our hunks.
func TestHunksApplyWithPatch(t *testing.T) {
	if _, err := exec.LookPath("patch"); err != nil {
		t.Skip("patch is not installed")
	}
	r := rand.New(rand.NewPCG(3, 4))
	dir := t.TempDir()
	for i := range 100 {
		sa := randomText(r, 5+r.IntN(60))
		sa = strings.TrimSuffix(sa, "no newline")
		sb := mutate(r, sa)
		if sa == sb {
			continue
		}
		a, b := lines(sa), lines(sb)
		var buf bytes.Buffer
		buf.WriteString("--- a/f\n+++ b/f\n")
		writeHunks(&buf, a, b, lineDiff(a, b), 3)
		f := filepath.Join(dir, "f")
		os.WriteFile(f, []byte(sa), 0o644)
		cmd := exec.Command("patch", "-s", "-p1", "--no-backup-if-mismatch", "-F0")
		cmd.Dir = dir
		cmd.Stdin = &buf
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("case %d: patch: %v: %s\n%s", i, err, out, buf.String())
		}
		if got, _ := os.ReadFile(f); string(got) != sb {
			t.Fatalf("case %d: patched file differs\n%q\nwant %q", i, got, sb)
		}
	}
}
