package shard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// Defaults of Config.
const (
	// DefaultDrainTimeout bounds how long a moving shard's work may take
	// to return before the shard is released anyway.
	DefaultDrainTimeout = 10 * time.Second
	// DefaultRetryMin is the first pause after a failed Lock of a shard.
	DefaultRetryMin = core.RetryFirstPause
	// DefaultRetryMax bounds the pause after failed Locks of a shard.
	DefaultRetryMax = 5 * time.Second
	// releaseTimeout bounds the release of a shard and the leave.
	releaseTimeout = 5 * time.Second
	// membersInfix separates the group's name from its members' keys: a
	// segment starting with "." is not a valid name, so no other primitive
	// uses these keys.
	membersInfix = "/.members/"
)

var (
	// ErrMemberRunning is returned by Run while the member already runs
	// the group: the same Group, or another Group of the same name through
	// the same session. It wraps holdfast.ErrInvalidArgument.
	ErrMemberRunning = fmt.Errorf("%w: the member already runs this group", holdfast.ErrInvalidArgument)
	// ErrMoved is the cause (context.Cause) of a work's context when its
	// shard is assigned to another member.
	ErrMoved = errors.New("shard: the shard moves to another member")
	// ErrLeaving is the cause of a work's context when Run's context ends.
	ErrLeaving = errors.New("shard: the member leaves the group")
)

// Shard is one shard of a group.
type Shard struct {
	// Index is the shard's number, 0 to N-1.
	Index int
	// Name is Config.Names[Index], or Index in decimal. The shard's lock
	// is "<group>/<Name>".
	Name string
}

// Config describes a group. Every member of a group must give the same
// Shards and Names; a member that finds another with different ones stops
// with holdfast.ErrConflict.
type Config struct {
	// Shards is the number of shards, N (1 to MaxShards). It may be left 0
	// when Names is given.
	Shards int

	// Names, if set, names the shards (len(Names) must equal Shards if
	// both are set). A name is one path segment: valid for
	// holdfast.ValidateName, without "/". Default: "0" to "N-1".
	Names []string

	// Member is what Inspect shows of this member (a host name, say).
	// Optional; default: the session's ID.
	Member string

	// DrainTimeout bounds how long Run waits for a work whose context has
	// ended (its shard moves, or Run's context ended) before it releases
	// the shard anyway; the work's grant then ends (holdfast.ErrReleased),
	// so its guarded writes are refused. Default DefaultDrainTimeout.
	DrainTimeout time.Duration

	// RetryMin and RetryMax bound the pause after a failed Lock of a shard
	// (an unreachable store, say): it starts at RetryMin and doubles up to
	// RetryMax. Defaults: DefaultRetryMin, DefaultRetryMax.
	RetryMin, RetryMax time.Duration

	// Observer, if set, is told of every shard this member starts and
	// stops owning (metrics.Metrics implements it).
	Observer Observer
}

// Observer is told of a member's shard changes. Its methods must not
// block. *metrics.Metrics implements it.
type Observer interface {
	// ShardAcquired is called when the member owns a shard (its work is
	// about to start).
	ShardAcquired(group string, shard Shard)
	// ShardReleased is called when the member stops owning a shard:
	// cause is ErrMoved (moved to another member), ErrLeaving (Run's
	// context ended), holdfast.ErrReleased (work returned by itself), or
	// an error wrapping holdfast.ErrLost (the grant was lost).
	ShardReleased(group string, shard Shard, cause error)
}

// Group is one member's view of a group of shards. Make it with New.
type Group[G holdfast.Grant] struct {
	b      backend[G]
	name   string
	shards []Shard
	names  []string
	cfg    Config
	value  []byte

	mu      sync.Mutex
	running bool
	owned   map[int]G
}

// MaxShards is the largest number of shards a group may have: every member
// keeps a lock per shard it owns and computes the assignment over all of
// them, so a mistyped N is refused before it costs memory.
const MaxShards = 65536

// memberValue is the value of a member's key.
type memberValue struct {
	Member string   `json:"member"`
	Shards int      `json:"shards"`
	Names  []string `json:"names,omitempty"`
}

// New returns the member of the group called name that s's session runs.
// The name follows holdfast.ValidateName; the shards' locks are
// "<name>/<shard name>", and the members' keys "<name>/.members/<id>".
//
// It returns an error wrapping holdfast.ErrInvalidArgument, before any
// request, if s is nil, the name or a shard's name is invalid, there is no
// shard, the shard names repeat, or the config is otherwise invalid.
func New[G holdfast.Grant](s *Store[G], name string, cfg Config) (*Group[G], error) {
	if s == nil || s.b == nil {
		return nil, fmt.Errorf("%w: shard.New: nil store", holdfast.ErrInvalidArgument)
	}
	if err := holdfast.ValidateName(name); err != nil {
		return nil, fmt.Errorf("shard.New: group name: %w", err)
	}
	var errs []error
	switch {
	case cfg.Names == nil && cfg.Shards < 1:
		errs = append(errs, fmt.Errorf("Shards %d: a group needs at least 1 shard", cfg.Shards))
	case cfg.Names != nil && len(cfg.Names) == 0:
		errs = append(errs, errors.New("empty Names: a group needs at least 1 shard"))
	case cfg.Shards > MaxShards || len(cfg.Names) > MaxShards:
		errs = append(errs, fmt.Errorf("%d shards: a group has at most MaxShards (%d)", max(cfg.Shards, len(cfg.Names)), MaxShards))
	case cfg.Names != nil && cfg.Shards != 0 && cfg.Shards != len(cfg.Names):
		errs = append(errs, fmt.Errorf("Shards %d but %d Names", cfg.Shards, len(cfg.Names)))
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	if cfg.RetryMin == 0 {
		cfg.RetryMin = DefaultRetryMin
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = max(DefaultRetryMax, cfg.RetryMin)
	}
	switch {
	case cfg.DrainTimeout < 0:
		errs = append(errs, fmt.Errorf("DrainTimeout %v is negative", cfg.DrainTimeout))
	case cfg.RetryMin < 0:
		errs = append(errs, fmt.Errorf("RetryMin %v is negative", cfg.RetryMin))
	case cfg.RetryMax < cfg.RetryMin:
		errs = append(errs, fmt.Errorf("RetryMax %v is below RetryMin %v", cfg.RetryMax, cfg.RetryMin))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: shard.Config: %w", holdfast.ErrInvalidArgument, errors.Join(errs...))
	}
	names := cfg.Names
	if names == nil {
		names = make([]string, cfg.Shards)
		for i := range names {
			names[i] = strconv.Itoa(i)
		}
	}
	seen := make(map[string]bool, len(names))
	shards := make([]Shard, len(names))
	for i, n := range names {
		if strings.Contains(n, "/") {
			return nil, fmt.Errorf("%w: shard.Config: shard name %q has a /", holdfast.ErrInvalidArgument, n)
		}
		if err := holdfast.ValidateName(name + "/" + n); err != nil {
			return nil, fmt.Errorf("shard.Config: shard %d: %w", i, err)
		}
		if seen[n] {
			return nil, fmt.Errorf("%w: shard.Config: shard name %q repeats", holdfast.ErrInvalidArgument, n)
		}
		seen[n] = true
		shards[i] = Shard{Index: i, Name: n}
	}
	cfg.Shards = len(names)
	v := memberValue{Member: cfg.Member, Shards: cfg.Shards}
	if cfg.Names != nil {
		v.Names = names
	}
	value, _ := json.Marshal(v)
	return &Group[G]{b: s.b, name: name, shards: shards, names: slices.Clone(names), cfg: cfg, value: value, owned: map[int]G{}}, nil
}

// Name returns the group's name.
func (g *Group[G]) Name() string { return g.name }

// Shards returns the group's shards.
func (g *Group[G]) Shards() []Shard { return slices.Clone(g.shards) }

// Owned returns the shards whose work runs now in this member, by index.
func (g *Group[G]) Owned() []Shard {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []Shard
	for i := range g.owned {
		out = append(out, g.shards[i])
	}
	slices.SortFunc(out, func(a, b Shard) int { return a.Index - b.Index })
	return out
}

// running members, by session ID and group name: a member runs a group
// once at a time.
var (
	runningMu sync.Mutex
	runningAt = map[string]bool{}
)

// Run makes this member one of the group's until ctx ends, and calls work
// for each shard it owns, in a goroutine of its own, with the shard's
// grant: g.Token() fences the work's writes (tokens of a shard strictly
// increase from owner to owner), and the backend's guarded writes (etcd
// Grant.Txn, Consul Grant.Txn) commit only while the shard is held.
//
// The steps:
//  1. The group's name must not be another primitive's (a read of it:
//     holdfast.ErrConflict otherwise).
//  2. The member writes its key "<name>/.members/<session ID>", held by
//     its session, and follows the members' keys.
//  3. On every change of the members, it computes the assignment of the
//     shards to the live members (rendezvous hashing with bounded loads:
//     every member owns floor(N/M) or ceil(N/M) shards, and every member
//     computes the same assignment from the same members).
//  4. For each shard assigned to it, it waits for the shard's lock (only
//     then: members never queue for shards that are not theirs), and calls
//     work once it is granted.
//  5. When a shard is assigned elsewhere, its work's context ends with
//     cause ErrMoved (a lock still awaited is given up); once work returns
//     (or after DrainTimeout) the shard is released, and the new owner,
//     already waiting for the lock, is granted it within milliseconds.
//
// work's context ends when the shard moves (ErrMoved), when Run's context
// ends (ErrLeaving), or when the grant is lost (its cause wraps
// holdfast.ErrLost; the backends end it before the store could grant the
// shard to another member). work should return promptly then. If work
// returns while the shard is still assigned here, the shard is released and
// locked again after RetryMin.
//
// When ctx ends, Run deletes the member's key first (the others recompute
// and queue for its shards), then ends every work's context, releases each
// shard once its work has returned (or after DrainTimeout), and returns nil
// once every work has returned. It returns an error if the session ends
// (wrapping holdfast.ErrSessionLost or holdfast.ErrSessionClosed: Run does
// not open sessions), if a shard's name is another primitive's
// (holdfast.ErrConflict), if a member already runs the group with other
// shards (holdfast.ErrConflict: read before the member joins; a member with
// other shards that joins later is left out of the assignment), and at once ErrMemberRunning if the member
// already runs this group, or an error wrapping
// holdfast.ErrInvalidArgument if ctx or work is nil.
func (g *Group[G]) Run(ctx context.Context, work func(ctx context.Context, s Shard, grant G)) error {
	if ctx == nil || work == nil {
		return fmt.Errorf("%w: shard.Run: nil context or work", holdfast.ErrInvalidArgument)
	}
	id := g.b.id()
	at := id + "\x00" + g.name
	runningMu.Lock()
	if g.running || runningAt[at] {
		runningMu.Unlock()
		return fmt.Errorf("shard.Run %s: member %s: %w", g.name, id, ErrMemberRunning)
	}
	g.running, runningAt[at] = true, true
	runningMu.Unlock()
	defer func() {
		runningMu.Lock()
		g.running = false
		delete(runningAt, at)
		runningMu.Unlock()
	}()

	// 1. The group's name is no other primitive's.
	st, err := g.b.inspect(ctx, g.name)
	if err != nil {
		return g.ended(ctx, fmt.Errorf("shard.Run %s: %w", g.name, err))
	}
	if st.Kind != holdfast.KindUnknown {
		return fmt.Errorf("shard.Run %s: %w: the name is a %s", g.name, holdfast.ErrConflict, st.Kind)
	}
	// 2. Join, if the members run the same shards, and follow the members.
	view, err := g.b.list(ctx, g.name+membersInfix)
	if err != nil {
		return g.ended(ctx, fmt.Errorf("shard.Run %s: %w", g.name, err))
	}
	if _, err := g.members(view, id, true); err != nil {
		return err
	}
	key := g.name + membersInfix + id
	if err := g.b.join(ctx, key, g.value); err != nil {
		return g.ended(ctx, fmt.Errorf("shard.Run %s: %w", g.name, err))
	}
	wctx, stopWatch := context.WithCancel(ctx)
	views := make(chan []entry, 1)
	var watching sync.WaitGroup
	watching.Go(func() { g.b.watch(wctx, g.name+membersInfix, views) })

	var (
		runners = map[int]context.CancelCauseFunc{}
		wg      sync.WaitGroup
		failed  = make(chan error, 1)
		locks   = map[int]holdfast.GrantLocker[G]{}
		result  error
	)
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-g.b.done().Done():
			result = fmt.Errorf("shard.Run %s: %w", g.name, context.Cause(g.b.done()))
			break loop
		case err := <-failed:
			result = err
			break loop
		case view := <-views:
			members, _ := g.members(view, id, false)
			owner := assign(g.names, members)
			for i, o := range owner {
				mine := members[o] == id
				switch cancel, running := runners[i]; {
				case mine && !running:
					l, ok := locks[i]
					if !ok {
						if l, err = g.b.mutex(g.name + "/" + g.names[i]); err != nil {
							result = fmt.Errorf("shard.Run %s: %w", g.name, err)
							break loop
						}
						locks[i] = l
					}
					rctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
					runners[i] = cancel
					wg.Go(func() { g.serve(rctx, g.shards[i], l, work, failed) })
				case !mine && running:
					cancel(ErrMoved)
					delete(runners, i)
				}
			}
		}
	}
	// Leave first, so that the others queue for our shards while they
	// drain; then end the works and wait for the releases.
	stopWatch()
	watching.Wait()
	lctx, lcancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	_ = g.b.leave(lctx, key) // the session's end removes it otherwise
	lcancel()
	for _, cancel := range runners {
		cancel(ErrLeaving)
	}
	wg.Wait()
	return result
}

// ended returns the session's end if it has ended (the likely cause of
// err), else err.
func (g *Group[G]) ended(ctx context.Context, err error) error {
	if c := context.Cause(g.b.done()); c != nil && ctx.Err() == nil {
		return fmt.Errorf("shard.Run %s: %w", g.name, c)
	}
	return err
}

// members returns the sorted IDs of the live members in view, with id. A
// member that runs other shards is an error wrapping holdfast.ErrConflict
// if strict, else it is left out.
func (g *Group[G]) members(view []entry, id string, strict bool) ([]string, error) {
	members := []string{id}
	for _, e := range view {
		mid := strings.TrimPrefix(e.key, g.name+membersInfix)
		if mid == id || strings.Contains(mid, "/") {
			continue
		}
		var v memberValue
		if json.Unmarshal(e.value, &v) != nil || v.Shards != len(g.names) || (v.Names != nil && !slices.Equal(v.Names, g.names)) {
			if strict {
				return nil, fmt.Errorf("shard.Run %s: %w: member %s runs other shards (%s)", g.name, holdfast.ErrConflict, mid, e.value)
			}
			continue
		}
		members = append(members, mid)
	}
	slices.Sort(members)
	return members, nil
}

// serve owns shard s while ctx lives: it waits for the shard's lock, runs
// work under the grant, releases the shard once work has returned (or
// after DrainTimeout), and again while the shard stays assigned here.
func (g *Group[G]) serve(ctx context.Context, s Shard, l holdfast.GrantLocker[G], work func(context.Context, Shard, G), failed chan<- error) {
	backoff := core.Backoff{First: g.cfg.RetryMin, Max: g.cfg.RetryMax, Final: final}
	for ctx.Err() == nil {
		var gr G
		err := backoff.Retry(ctx, func(ctx context.Context) (err error) {
			gr, err = l.Lock(ctx)
			return err
		})
		if err != nil {
			if ctx.Err() == nil {
				select {
				case failed <- fmt.Errorf("shard.Run %s: shard %s: %w", g.name, s.Name, err):
				default:
				}
			}
			return
		}
		if g.hold(ctx, s, gr, work) && ctx.Err() == nil {
			core.Sleep(ctx, g.cfg.RetryMin)
		}
	}
}

// hold runs work under gr until it returns, then releases the shard, and
// reports whether work returned by itself while the shard was held.
func (g *Group[G]) hold(ctx context.Context, s Shard, gr G, work func(context.Context, Shard, G)) bool {
	wctx, cancel := context.WithCancelCause(gr.Context())
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	g.mu.Lock()
	g.owned[s.Index] = gr
	g.mu.Unlock()
	if o := g.cfg.Observer; o != nil {
		o.ShardAcquired(g.name, s)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		work(wctx, s, gr)
	}()
	byItself := false
	select {
	case <-done:
		byItself = wctx.Err() == nil
	case <-wctx.Done():
		t := time.NewTimer(g.cfg.DrainTimeout)
		select {
		case <-done:
		case <-t.C:
		}
		t.Stop()
	}
	stop()
	cause := context.Cause(wctx)
	g.mu.Lock()
	delete(g.owned, s.Index)
	g.mu.Unlock()
	if lost := context.Cause(gr.Context()); lost != nil && !errors.Is(lost, holdfast.ErrReleased) {
		cause = lost
	}
	// Unlock even a grant seen as lost: past its safe deadline, the key
	// may still be the session's in the store.
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	_ = gr.Unlock(uctx) // the session goes on releasing it otherwise
	ucancel()
	if cause == nil {
		cause = holdfast.ErrReleased
	}
	<-done // after DrainTimeout, work may still run, its grant ended
	cancel(nil)
	if o := g.cfg.Observer; o != nil {
		o.ShardReleased(g.name, s, cause)
	}
	return byItself
}

// final reports whether a Lock error will not go away by locking again:
// as for leader.Run, a final error except the loss of the key the attempt
// itself had put; the session's loss is final.
func final(err error) bool {
	if errors.Is(err, holdfast.ErrSessionLost) {
		return true
	}
	return core.Final(err) && !errors.Is(err, holdfast.ErrLost) && !errors.Is(err, holdfast.ErrNotHeld)
}
