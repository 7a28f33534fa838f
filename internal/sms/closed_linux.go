package sms

import (
	"crypto/tls"
	"net"
	"syscall"
)

// closedByPeer reports whether the peer closed or reset conn, an idle
// pooled connection, without reading from it: a peek that does not wait.
// Unsolicited bytes on a plain connection count as closed too (an idle
// HTTP/1.1 connection has nothing to say); on a TLS connection they may be
// a session ticket, so they do not.
func closedByPeer(conn net.Conn) bool {
	plain := true
	if tc, ok := conn.(*tls.Conn); ok {
		conn, plain = tc.NetConn(), false
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	var (
		buf  [1]byte
		n    int
		perr error
	)
	if err := rc.Read(func(fd uintptr) bool {
		n, _, perr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // never wait
	}); err != nil {
		return true
	}
	switch {
	case perr == syscall.EAGAIN || perr == syscall.EINTR:
		return false // nothing to read: open
	case perr != nil:
		return true // reset
	case n == 0:
		return true // the peer's FIN
	default:
		return plain
	}
}
