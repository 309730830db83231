package profile

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// User is who the sandbox runs as: the launcher's own uid and gid (host,
// the default and the zero value), root, or a UID:GID. It is parsed once,
// when the profile is decoded.
type User struct {
	kind     userKind
	uid, gid int
	text     string // what was written, when it is not a user (Check reports it)
}

type userKind int

const (
	userHost userKind = iota
	userRoot
	userID
	userInvalid
)

// HostUser is the launcher's own uid and gid.
func HostUser() User { return User{} }

// RootUser is root, 0:0.
func RootUser() User { return User{kind: userRoot} }

// IDUser is the user uid:gid.
func IDUser(uid, gid int) User { return User{kind: userID, uid: uid, gid: gid} }

// ParseUser reads host, root or UID:GID.
func ParseUser(s string) (User, error) {
	switch s {
	case "host":
		return HostUser(), nil
	case "root":
		return RootUser(), nil
	}
	a, b, ok := strings.Cut(s, ":")
	uid, err1 := strconv.Atoi(a)
	gid, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || uid < 0 || gid < 0 {
		return User{kind: userInvalid, text: s}, fmt.Errorf("%q is not host, root or UID:GID", s)
	}
	return IDUser(uid, gid), nil
}

// IsHost reports whether the sandbox runs as the launcher's own user.
func (u User) IsHost() bool { return u.kind == userHost }

// IsRoot reports whether the sandbox runs as uid 0 (root, or 0:GID).
func (u User) IsRoot() bool { return u.kind == userRoot || u.kind == userID && u.uid == 0 }

// IDs are the uid and gid the sandbox runs as, where the launcher's own
// are hostUID and hostGID.
func (u User) IDs(hostUID, hostGID int) (uid, gid int) {
	switch u.kind {
	case userHost:
		return hostUID, hostGID
	case userID:
		return u.uid, u.gid
	}
	return 0, 0
}

// String is the user as a profile writes it.
func (u User) String() string {
	switch u.kind {
	case userHost:
		return "host"
	case userRoot:
		return "root"
	case userID:
		return strconv.Itoa(u.uid) + ":" + strconv.Itoa(u.gid)
	}
	return u.text
}

// UnmarshalYAML reads host, root or UID:GID. A value that is none of them
// is kept for Check to report at its position (the schema rejects it first).
func (u *User) UnmarshalYAML(n *yaml.Node) error {
	*u, _ = ParseUser(n.Value)
	if n.Kind != yaml.ScalarNode {
		*u = User{kind: userInvalid, text: n.Value}
	}
	return nil
}

// MarshalYAML writes the user as a profile would.
func (u User) MarshalYAML() (any, error) { return u.String(), nil }

// err is the problem with the user as written, if any.
func (u User) err() error {
	if u.kind == userInvalid {
		return fmt.Errorf("%q is not host, root or UID:GID", u.text)
	}
	return nil
}
