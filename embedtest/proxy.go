package embedtest

import (
	"net"
	"sync"
	"testing"
)

// Proxy is a loopback TCP proxy that injects network faults between a client
// and a server. Its modes:
//
//   - Mend (the default): bytes flow both ways.
//   - Pause: bytes stop in both directions but are kept, and delivered on
//     Mend, as a peer frozen by SIGSTOP or a long GC pause would see it;
//     connections stay open.
//   - Blackhole: bytes are dropped in both directions, as in a network
//     partition; connections stay open, and what was dropped is lost.
//
// New connections are accepted in every mode (the kernel completes the TCP
// handshake), so a client sees a fault as silence, never as a refusal.
// Methods are safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cond   *sync.Cond
	mode   mode
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

type mode int

const (
	flowing mode = iota
	paused
	blackholed
)

// NewProxy listens on a free loopback port and forwards every connection to
// target (host:port). The caller must call Close.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// StartProxy is NewProxy for tests: it fails t if the proxy cannot start and
// closes it when t ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := NewProxy(target)
	if err != nil {
		t.Fatalf("embedtest: start proxy to %s: %v", target, err)
	}
	t.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns the proxy's address as an http URL, the form etcd clients
// take as an endpoint.
func (p *Proxy) URL() string { return "http://" + p.Addr() }

// Pause holds all traffic until Mend, as a frozen peer would.
func (p *Proxy) Pause() { p.set(paused) }

// Blackhole drops all traffic until Mend, as a partition would.
func (p *Proxy) Blackhole() { p.set(blackholed) }

// Mend lets traffic flow again; bytes held by Pause are delivered.
func (p *Proxy) Mend() { p.set(flowing) }

func (p *Proxy) set(m mode) {
	p.mu.Lock()
	p.mode = m
	p.mu.Unlock()
	p.cond.Broadcast()
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.cond.Broadcast()
	p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(in) {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			p.untrack(in)
			continue
		}
		if !p.track(out) {
			p.untrack(in)
			return
		}
		p.wg.Add(2)
		go p.pipe(out, in)
		go p.pipe(in, out)
	}
}

// pipe copies src to dst: each chunk waits while paused and is dropped while
// blackholed.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer p.untrack(dst)
	defer p.untrack(src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.mode == paused && !p.closed {
				p.cond.Wait()
			}
			m, closed := p.mode, p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			if m == flowing {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil { // io.EOF or a closed connection
			return
		}
	}
}
