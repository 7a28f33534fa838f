package sms

import (
	"crypto/tls"
	"net"
	"syscall"
)

// peeker tells whether the peer closed or reset an idle pooled connection,
// without reading from it: a peek that does not wait. It is made once per
// connection (newPeeker), with its raw connection and the peek's function,
// so that a look costs the syscall alone and no allocation: made per send,
// they were four allocations and a third of the look's CPU
// (docs/benchmarks.md, "The Go share of CPU per delivered reminder, slice 5").
type peeker struct {
	raw syscall.RawConn
	// plain: unsolicited bytes on a plain connection count as closed (an
	// idle HTTP/1.1 connection has nothing to say); on a TLS connection
	// they may be a session ticket, so they do not.
	plain bool
	look  func(fd uintptr) bool // p.peek, bound once
	n     int
	err   error
	buf   [1]byte
}

// newPeeker returns conn's peeker, or nil when conn has no socket to look
// at (then closed says open).
func newPeeker(conn net.Conn) *peeker {
	p := &peeker{plain: true}
	if tc, ok := conn.(*tls.Conn); ok {
		conn, p.plain = tc.NetConn(), false
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	p.raw = raw
	p.look = p.peek
	return p
}

func (p *peeker) peek(fd uintptr) bool {
	p.n, _, p.err = syscall.Recvfrom(int(fd), p.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return true // never wait
}

// closed reports whether the peer closed or reset the connection.
func (p *peeker) closed() bool {
	if p == nil {
		return false
	}
	if err := p.raw.Read(p.look); err != nil {
		return true
	}
	switch {
	case p.err == syscall.EAGAIN || p.err == syscall.EINTR:
		return false // nothing to read: open
	case p.err != nil:
		return true // reset
	case p.n == 0:
		return true // the peer's FIN
	default:
		return p.plain
	}
}
