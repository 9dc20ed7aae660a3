package holdfast_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
	hfconsul "github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	hfetcd "github.com/holdfast/holdfast/etcd"
)

// FuzzValidateName: every name ValidateName accepts is one both real stores
// accept: a Mutex on it locks and unlocks on embedded etcd and on a real
// Consul agent; a name it refuses is refused with ErrInvalidName by both
// backends' constructors, before any request. The seed corpus runs in every
// "go test"; "go test -fuzz FuzzValidateName" explores further.
func FuzzValidateName(f *testing.F) {
	for _, s := range []string{
		"a", "jobs/nightly", "locks/v1.2", "a-b_c~d", "a%20b", "a%b", "a?b", "a#b", "a+b", "a&b=c",
		"a;b", "a:b", "a@b", "a!b", "a*b", "a'b", "a\"b", "a<b>", "a\\b", "a|b", "a^b", "a`b", "a{b}", "a[b]",
		"é", "日本/語", "Ωmega", "e\u0301", "a\u200bb", "a\u200db", "a\u2028b", "a\u00a0b", "a\ufeffb", "a\u202eb",
		"a\ue000b", "a\U0001f512b", "a\ufffdb", "a\u0378b", "a b", "a\tb", "a\x00b", "a\x7fb", "\xff", "a/./b", "a/../b",
		"a/.b", ".a", "a/", "/a", "a//b", "",
	} {
		f.Add(s)
	}
	f.Add(string(make([]byte, 513)))
	f.Add(strings.Repeat("日本/", 102) + "ab") // 512 bytes
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// One session per store for every input (a fuzzing run tries many).
	es, err := hfetcd.Dial(ctx, etcdtest.Etcd(f).Endpoints())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { es.Close() })
	cs, err := hfconsul.Dial(ctx, embedtest.Consul(f).HTTPAddr, hfconsul.WithLockDelay(0))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { cs.Close() })
	f.Fuzz(func(t *testing.T, name string) {
		err := holdfast.ValidateName(name)
		if err != nil && !errors.Is(err, holdfast.ErrInvalidName) {
			t.Fatalf("ValidateName(%q) = %v, want nil or ErrInvalidName", name, err)
		}
		if err != nil {
			if _, eerr := hfetcd.NewMutex(es, name); !errors.Is(eerr, holdfast.ErrInvalidName) {
				t.Errorf("etcd.NewMutex(%q) = %v, want ErrInvalidName", name, eerr)
			}
			if _, cerr := hfconsul.NewMutex(cs, name); !errors.Is(cerr, holdfast.ErrInvalidName) {
				t.Errorf("consul.NewMutex(%q) = %v, want ErrInvalidName", name, cerr)
			}
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		em, err := hfetcd.NewMutex(es, name)
		if err != nil {
			t.Fatalf("etcd.NewMutex(%q): %v", name, err)
		}
		cm, err := hfconsul.NewMutex(cs, name)
		if err != nil {
			t.Fatalf("consul.NewMutex(%q): %v", name, err)
		}
		for _, l := range []struct {
			store string
			lock  func(context.Context) (holdfast.Grant, error)
		}{
			{"etcd TryLock", holdfast.AsLocker(em).TryLock}, {"etcd Lock", holdfast.AsLocker(em).Lock},
			{"consul TryLock", holdfast.AsLocker(cm).TryLock}, {"consul Lock", holdfast.AsLocker(cm).Lock},
		} {
			g, err := l.lock(ctx)
			if err != nil {
				t.Errorf("ValidateName accepts %q, but %s fails: %v", name, l.store, err)
				continue
			}
			if err := g.Unlock(ctx); err != nil {
				t.Errorf("%s: unlock %q: %v", l.store, name, err)
			}
		}
	})
}
