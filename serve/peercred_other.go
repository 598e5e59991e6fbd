//go:build !linux

package serve

import (
	"errors"
	"net"
)

// peerCred is only implemented on Linux (SO_PEERCRED); elsewhere every peer is
// refused.
func peerCred(*net.UnixConn) (uid, pid int, err error) {
	return 0, 0, errors.New("serve: peer credentials are only checked on Linux")
}
