package etcd

import (
	"fmt"
	"strings"
	"testing"
)

// TestConfigHidesPassword: the configuration WithCredentials fills never
// formats the password, whatever the verb, and the session keeps none of
// the Dial-only settings.
func TestConfigHidesPassword(t *testing.T) {
	const pw = "S3cret-pw-for-fmt"
	cfg, err := newSessionConfig([]SessionOption{WithCredentials("alice", pw), WithTLSFiles("ca.pem", "", "")})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.dial.password.Reveal() != pw {
		t.Fatal("password not kept for Dial")
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%q"} {
		for _, arg := range []any{cfg, &cfg, cfg.dial, []SessionOption{WithCredentials("a", pw)}} {
			if out := fmt.Sprintf(verb, arg); strings.Contains(out, pw) || strings.Contains(out, fmt.Sprintf("%x", pw)) {
				t.Errorf("Sprintf(%q, %T) shows the password: %s", verb, arg, out)
			}
		}
	}
}
