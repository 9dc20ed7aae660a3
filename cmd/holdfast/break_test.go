package main

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest"
)

// TestOnceAtMostRange: an --at-most out of the store's range is a usage
// error found before any request (exit 2 naming --at-most, even with the
// store unreachable), and --at-most's default never is: on Consul it is
// --every capped at 48 h, so a weekly job runs without --at-most.
func TestOnceAtMostRange(t *testing.T) {
	holdfastBin(t)
	refused := refusedAddr(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"etcd/short", []string{"--endpoints", refused, "--at-most", "1s"}, "--at-most 1s"},
		{"consul/short", []string{"--backend", "consul", "--addr", refused, "--at-most", "5s"}, "--at-most 5s"},
		{"consul/long", []string{"--backend", "consul", "--addr", refused, "--at-most", "49h"}, "--at-most 49h0m0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := start(t, append(append([]string{"once", "--every", "1m"}, tc.args...), "br/at", "--", "true")...)
			if code := p.wait(t, 10*time.Second); code != 2 || !strings.Contains(p.stderr.String(), tc.want) {
				t.Errorf("exit %d, stderr %q: want 2 naming %q", code, p.stderr.String(), tc.want)
			}
		})
	}
	t.Run("consul/weekly", func(t *testing.T) {
		a := embedtest.Consul(t)
		p := start(t, "once", "--backend", "consul", "--addr", a.HTTPAddr, "--every", "168h", "br/weekly", "--", "echo", "ran")
		if code := p.wait(t, 30*time.Second); code != 0 || strings.TrimSpace(p.stdout.String()) != "ran" {
			t.Errorf("once --every 168h on Consul: exit %d, stdout %q, stderr %q: want the command run", code, p.stdout.String(), p.stderr.String())
		}
	})
}

// TestOtherStoreAddressFlag: --addr (Consul's) given with etcd, or
// --endpoints (etcd's) with Consul, is "a flag of the other store": exit 2
// before any request, as --lock-delay, --user and --token are; it was
// ignored, and holdfast went to the other store's default address.
func TestOtherStoreAddressFlag(t *testing.T) {
	holdfastBin(t)
	refused := refusedAddr(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"lock", "--endpoints", refused, "--addr", refused, "br/x", "--", "true"}, "--addr applies to Consul only"},
		{[]string{"status", "--endpoints", refused, "--addr", refused, "br/x"}, "--addr applies to Consul only"},
		{[]string{"lock", "--backend", "consul", "--addr", refused, "--endpoints", refused, "br/x", "--", "true"}, "--endpoints applies to etcd only"},
		{[]string{"elect", "--observe", "--backend", "consul", "--addr", refused, "--endpoints", refused, "br/x"}, "--endpoints applies to etcd only"},
	} {
		p := start(t, tc.args...)
		if code := p.wait(t, 10*time.Second); code != 2 || !strings.Contains(p.stderr.String(), tc.want) {
			t.Errorf("holdfast %q: exit %d, stderr %q: want 2 saying %q", tc.args, code, p.stderr.String(), tc.want)
		}
	}
}

// TestSilentStoreAfterRelease: when the store goes silent while CMD runs
// and stays silent after CMD's normal end, holdfast waits releaseTimeout
// (5 s) for the release, then at most lostCloseTimeout for the session's
// close, leaving the rest to the store's expiry: it exits within 6 s of
// CMD's end. Before, the close waited for the client's own bound too: 10 s
// after CMD's end on etcd 3.4 (15 s on Consul).
func TestSilentStoreAfterRelease(t *testing.T) {
	ep, pid := startEtcdProcess(t)
	p := start(t, "lock", "--endpoints", ep, "br/silent", "--", "sh", "-c", fmt.Sprintf("kill -STOP %d", pid))
	code := p.wait(t, 30*time.Second)
	_ = syscall.Kill(pid, syscall.SIGCONT)
	t.Logf("exit %d after %v: %s", code, p.took.Round(time.Millisecond), p.stderr.String())
	if code != 0 || p.took > releaseTimeout+time.Second {
		t.Errorf("exit %d after %v, want 0 within %v (release bound + 1 s)", code, p.took, releaseTimeout+time.Second)
	}
}
