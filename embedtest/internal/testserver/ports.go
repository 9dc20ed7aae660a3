// Package testserver holds what the servers of embedtest, etcdtest and
// pgtest share: loopback ports reserved process-wide, output tails, small
// checks.
package testserver

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
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

// FreePorts reserves n distinct free loopback ports. When udp is true each
// port is also checked to be free for UDP (Serf uses both).
func FreePorts(n int, udp bool) ([]int, error) {
	ports := make([]int, 0, n)
	for len(ports) < n {
		p, err := FreePort(udp)
		if err != nil {
			ReleasePorts(ports)
			return nil, err
		}
		ports = append(ports, p)
	}
	return ports, nil
}

// Ports are picked at random below the kernel's ephemeral range: the
// ports of outgoing connections come from that range, so a port picked
// there could be taken by any connection (of this process or another test
// package running in parallel) while a member that owns it is stopped, and
// the member could not restart on it. Below the range, only another
// process that picks the same port at random can take it.
const (
	// PortRangeLow is the lowest port handed out.
	PortRangeLow = 10000
	// defaultEphemeralLow is Linux's default when the range cannot be read.
	defaultEphemeralLow = 32768
)

// EphemeralLow returns the first port of the kernel's ephemeral range.
func EphemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultEphemeralLow
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return defaultEphemeralLow
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil || lo <= PortRangeLow+1000 {
		return defaultEphemeralLow
	}
	return lo
}

// FreePort reserves one free loopback port (see FreePorts).
func FreePort(udp bool) (int, error) {
	var lastErr error
	hi := EphemeralLow()
	for range maxPortProbes {
		p := PortRangeLow + rand.IntN(hi-PortRangeLow)
		reservedMu.Lock()
		taken := reserved[p]
		reservedMu.Unlock()
		if taken {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			lastErr = err
			continue
		}
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
		taken = reserved[p]
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
	return 0, fmt.Errorf("embedtest: no free loopback port below %d after %d probes: %w", hi, maxPortProbes, lastErr)
}

// ReleasePorts hands reserved ports back.
func ReleasePorts(ports []int) {
	reservedMu.Lock()
	defer reservedMu.Unlock()
	for _, p := range ports {
		delete(reserved, p)
	}
}

// IsAddrInUse reports whether err comes from binding a port someone else holds.
func IsAddrInUse(err error) bool {
	return err != nil && (errors.Is(err, syscall.EADDRINUSE) ||
		strings.Contains(err.Error(), "address already in use"))
}
