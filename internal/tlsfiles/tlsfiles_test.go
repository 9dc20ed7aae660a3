package tlsfiles

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSecretFormats: a Secret never formats as itself, whatever the verb,
// alone or in a struct; Reveal gives it back.
func TestSecretFormats(t *testing.T) {
	const pw = "hunter2-S3cret"
	s := NewSecret(pw)
	v := struct {
		User     string
		Password Secret
	}{"alice", s}
	type config struct{ password Secret } // fmt cannot call methods here
	u := config{s}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%10s"} {
		for _, arg := range []any{s, v, &v, []Secret{s}, u, &u, map[string]Secret{"k": s}} {
			if out := fmt.Sprintf(verb, arg); strings.Contains(out, pw) || strings.Contains(out, fmt.Sprintf("%x", pw)) {
				t.Errorf("Sprintf(%q, %T) = %q shows the secret", verb, arg, out)
			}
		}
	}
	if s.Reveal() != pw || NewSecret("").String() != "" || !NewSecret("").Empty() || (Secret{}).Reveal() != "" {
		t.Error("Reveal or the empty secret")
	}
}

// TestLoadErrors: bad files are reported by name, never by contents.
func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "key.pem")
	const body = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgSECRETkeyMATERIAL"
	if err := os.WriteFile(key, []byte("-----BEGIN PRIVATE KEY-----\n"+body+"\n-----END PRIVATE KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][3]string{
		"missing CA":       {filepath.Join(dir, "nope.pem"), "", ""},
		"key as CA":        {key, "", ""},
		"cert without key": {"", key, ""},
		"key as cert":      {"", key, key},
	} {
		_, err := Load(args[0], args[1], args[2])
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if strings.Contains(err.Error(), body) || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("%s: the error quotes the key: %v", name, err)
		}
		if name == "missing CA" && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want os.ErrNotExist", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
	if cfg, err := Load("", "", ""); err != nil || cfg.RootCAs != nil || len(cfg.Certificates) != 0 {
		t.Errorf("Load of nothing: %v, %v", cfg, err)
	}
}
