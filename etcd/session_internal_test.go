package etcd

import "testing"

// TestRevokesEarly: the versions before the fix of etcd #15247 (#16822:
// 3.4.31, 3.5.13, 3.6.0) are reported, the later ones and unreadable ones
// are not.
func TestRevokesEarly(t *testing.T) {
	for v, want := range map[string]bool{
		"3.4.23": true, "3.4.30": true, "3.4.31": false, "3.4.40": false,
		"3.5.0": true, "3.5.12": true, "3.5.13": false, "3.5.21": false,
		"3.3.27": true, "2.3.8": true, "3.6.0": false, "3.7.3": false, "4.0.0": false,
		"3.5.0-alpha.0": true, "": false, "unknown": false,
	} {
		if got := revokesEarly(v); got != want {
			t.Errorf("revokesEarly(%q) = %v, want %v", v, got, want)
		}
	}
}
