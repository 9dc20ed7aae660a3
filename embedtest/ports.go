package embedtest

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

// Ports are picked at random below the kernel's ephemeral range: the
// ports of outgoing connections come from that range, so a port picked
// there could be taken by any connection (of this process or another test
// package running in parallel) while a member that owns it is stopped, and
// the member could not restart on it. Below the range, only another
// process that picks the same port at random can take it.
const (
	portRangeLow = 10000
	// defaultEphemeralLow is Linux's default when the range cannot be read.
	defaultEphemeralLow = 32768
)

// ephemeralLow returns the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultEphemeralLow
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return defaultEphemeralLow
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil || lo <= portRangeLow+1000 {
		return defaultEphemeralLow
	}
	return lo
}

func freePort(udp bool) (int, error) {
	var lastErr error
	hi := ephemeralLow()
	for range maxPortProbes {
		p := portRangeLow + rand.IntN(hi-portRangeLow)
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

// FreePorts returns n distinct loopback TCP ports, below the ephemeral
// range, that were free when probed and that no other server started by
// this process gets: for a server a test starts by other means (a child
// process, say). Another process can still take one before the server
// binds it.
func FreePorts(n int) ([]int, error) { return freePorts(n, false) }
