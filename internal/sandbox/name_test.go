package sandbox

import (
	"os"
	"path/filepath"
	"testing"
)

// TestClaimName: the first launch in a workspace takes the name render
// shows; while it holds it, the next takes NAME-2, and a name the engine's
// sandboxes hold is passed over; a released name is taken again.
func TestClaimName(t *testing.T) {
	dir := t.TempDir()
	ws := filepath.Join(t.TempDir(), "My Project")
	none := func(string) bool { return false }

	first, release1, err := claimName(dir, ws, none)
	if err != nil {
		t.Fatal(err)
	}
	if first != "propio-my-project" {
		t.Errorf("first name = %q, want propio-my-project (what render shows)", first)
	}
	second, release2, err := claimName(dir, ws, none)
	if err != nil {
		t.Fatal(err)
	}
	if second != "propio-my-project-2" {
		t.Errorf("second name while the first is held = %q, want propio-my-project-2", second)
	}
	onEngine := func(n string) bool { return n == "propio-my-project-3" }
	third, release3, err := claimName(dir, ws, onEngine)
	if err != nil {
		t.Fatal(err)
	}
	if third != "propio-my-project-4" {
		t.Errorf("third name with -3 on the engine = %q, want propio-my-project-4", third)
	}
	release1()
	again, release4, err := claimName(dir, ws, none)
	if err != nil {
		t.Fatal(err)
	}
	if again != first {
		t.Errorf("after the first is released: %q, want %q again", again, first)
	}
	release2()
	release3()
	release4()
}

// What a launcher made of a name it holds (or the background process its
// launcher handed the name to) is busy: gc leaves it; what another
// launcher made of the name, or of a name released or never claimed, is
// not.
func TestNameBusy(t *testing.T) {
	dir := t.TempDir()
	ws := filepath.Join(t.TempDir(), "ws")
	h, err := claimHeld(dir, ws, func(string) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	me := os.Getpid()
	if !nameBusy(dir, h.Name, me) {
		t.Errorf("%s is held but not busy", h.Name)
	}
	if nameBusy(dir, h.Name, me+1) {
		t.Error("what another launcher of the name made is busy")
	}
	if err := h.answerFor(me+1, me+2); err != nil {
		t.Fatal(err)
	}
	if !nameBusy(dir, h.Name, me+2) || nameBusy(dir, h.Name, me) {
		t.Error("the pids the holder answers for are not the ones it said")
	}
	if nameBusy(dir, h.Name+"-2", me) {
		t.Error("a name never claimed is busy")
	}
	h.release()
	if nameBusy(dir, h.Name, me+2) {
		t.Errorf("%s is released but busy", h.Name)
	}
}
