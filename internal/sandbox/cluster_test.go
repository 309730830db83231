package sandbox

import (
	"regexp"
	"strings"
	"testing"
)

// A sandbox's name on a cluster is a DNS label with room for its objects'
// suffixes, and no two launches share one.
func TestClusterName(t *testing.T) {
	label := regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	seen := map[string]bool{}
	for _, ws := range []string{"/home/me/project", "/home/me/My_Project.v2", "/x/" + strings.Repeat("long-name", 10)} {
		for range 3 {
			n, err := clusterName(ws)
			if err != nil {
				t.Fatal(err)
			}
			if !label.MatchString(n) || len(n) > 57 {
				t.Errorf("clusterName(%q) = %q: not a DNS label of at most 57 characters", ws, n)
			}
			if seen[n] {
				t.Errorf("clusterName(%q) gave %q twice", ws, n)
			}
			seen[n] = true
		}
	}
}
