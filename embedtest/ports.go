package embedtest

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
)

// reserved holds the ports this process has handed out and not yet released,
// so that two servers started concurrently in one process never get the same
// port. Other processes can still race for a port between our probe and the
// server's bind: callers retry on "address already in use".
var (
	reservedMu sync.Mutex
	reserved   = map[int]bool{}
)

// maxPortProbes bounds the attempts to find one free port.
const maxPortProbes = 64

// freePorts reserves n distinct free loopback ports. When udp is true each
// port is also checked to be free for UDP (Serf uses both).
func freePorts(n int, udp bool) ([]int, error) {
	ports := make([]int, 0, n)
	for len(ports) < n {
		p, err := freePort(udp)
		if err != nil {
			releasePorts(ports)
			return nil, err
		}
		ports = append(ports, p)
	}
	return ports, nil
}

func freePort(udp bool) (int, error) {
	var lastErr error
	for range maxPortProbes {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			lastErr = err
			continue
		}
		p := l.Addr().(*net.TCPAddr).Port
		if udp {
			u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				l.Close()
				lastErr = err
				continue
			}
			u.Close()
		}
		l.Close()
		reservedMu.Lock()
		taken := reserved[p]
		if !taken {
			reserved[p] = true
		}
		reservedMu.Unlock()
		if !taken {
			return p, nil
		}
	}
	if lastErr == nil {
		lastErr = errors.New("every probed port was already reserved")
	}
	return 0, fmt.Errorf("embedtest: no free loopback port after %d probes: %w", maxPortProbes, lastErr)
}

func releasePorts(ports []int) {
	reservedMu.Lock()
	defer reservedMu.Unlock()
	for _, p := range ports {
		delete(reserved, p)
	}
}

// isAddrInUse reports whether err comes from binding a port someone else holds.
func isAddrInUse(err error) bool {
	return err != nil && (errors.Is(err, syscall.EADDRINUSE) ||
		strings.Contains(err.Error(), "address already in use"))
}
