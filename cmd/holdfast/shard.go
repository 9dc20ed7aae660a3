package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/mutant"
	"github.com/holdfast/holdfast/shard"
)

var shardCommand = &command{
	name:    "shard",
	summary: "run one command per shard this process owns in a group shared by many processes",
	usage: `usage: holdfast shard [flags] --shards N GROUP [--] CMD [ARG...]

Makes this process a member of the shard group GROUP, whose N shards
(numbered 0 to N-1) are shared by every process that runs holdfast shard on
GROUP with the same N, and runs CMD once per shard it owns, with in its
environment:

  HOLDFAST_SHARD   the shard's number
  HOLDFAST_SHARDS  N
  HOLDFAST_TOKEN   the shard's fencing token: it increases from owner to owner
                   of the shard; pass it with every write to a fenced resource
  HOLDFAST_NAME    the shard's lock, GROUP/<shard>
  HOLDFAST_KEY     the store key of that lock

Each shard is a lock: two processes never own a shard at once. The shards are
balanced over the live members (each owns N/M, rounded down or up), and a
member joining or leaving moves only about N/M of them. When a shard moves
away, its CMD gets SIGTERM, then SIGKILL after --kill-grace, and the shard is
released only once CMD has exited; the new owner, already waiting for it,
starts its CMD at once. As with lock, CMD never outlives its shard: if
holdfast is killed (kill -9) or stopped, a guard process stops every CMD
before the store could give the shards to another member; if a shard is lost,
its CMD is stopped (SIGTERM, SIGKILL after --kill-grace). A CMD that exits by
itself while its shard is held is started again after a second.

CMD's stdin is closed; its stdout and stderr are holdfast's. holdfast says on
stderr when it starts and stops each shard's CMD.

Exit status:
  0               stopped by SIGINT or SIGTERM: every CMD stopped, every
                  shard released, the member gone
  2               a usage or input error, found before any request
  122             the session was lost; every CMD was stopped
  125             holdfast failed: the store unreachable, a conflict with
                  another primitive or with members running other shards
                  (see the message)`,
	flags: shardFlags,
}

// shardRestart is how long a shard whose CMD exited by itself waits before
// its CMD starts again.
const shardRestart = time.Second

func shardFlags(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	sf := addStoreFlags(fs)
	vis := addVisibilityFlags(fs)
	n := fs.Int("shards", 0, "the number of shards, `N` (required; the same in every member)")
	grace := fs.Duration("kill-grace", 10*time.Second, "when a shard moves or is lost, how long its CMD has between SIGTERM and SIGKILL")
	member := fs.String("member", "", "what holdfast status shows of this member (default: the host name)")
	return func(ctx context.Context, e *env, args []string) error {
		group, argv, err := splitCommand(ctx, args)
		if err != nil {
			return err
		}
		switch {
		case *n == 0:
			return usagef("--shards N is required (1 to %d)", shard.MaxShards)
		case *n < 1 || *n > shard.MaxShards:
			return usagef("--shards %d: want 1 to %d", *n, shard.MaxShards)
		case *grace < 0:
			return usagef("--kill-grace %v is negative", *grace)
		}
		if err := holdfast.ValidateName(group); err != nil {
			return explain(err, group, "")
		}
		if *member == "" {
			*member, _ = os.Hostname()
		}
		stop, err := vis.start(e, sf)
		if err != nil {
			return err
		}
		defer stop()
		s, err := sf.open(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return explain(err, group, sf.describe())
		}
		r := shardRunner{e: e, group: group, argv: argv, n: *n, grace: *grace, ttl: s.TTL(), verbose: *vis.verbose}
		cfg := shard.Config{Shards: *n, Member: *member, DrainTimeout: *grace + 5*time.Second, RetryMin: shardRestart}
		for _, o := range sf.observers {
			if so, ok := o.(shard.Observer); ok {
				cfg.Observer = so
			}
		}
		if s.etcd != nil {
			err = runShards(ctx, r, shard.Etcd(s.etcd), cfg)
		} else {
			err = runShards(ctx, r, shard.Consul(s.consul), cfg)
		}
		lost := errors.Is(err, holdfast.ErrSessionLost)
		closeSession(s, lost)
		switch {
		case err == nil:
			return nil
		case lost:
			return exitError{exitLost, explainf(err, "%s: %v", group, err)}
		default:
			return explain(err, group, sf.describe())
		}
	}
}

// shardRunner runs CMD for the shards a member owns.
type shardRunner struct {
	e       *env
	group   string
	argv    []string
	n       int
	grace   time.Duration
	ttl     time.Duration // the session's
	verbose bool
}

func runShards[G holdfast.Grant](ctx context.Context, r shardRunner, st *shard.Store[G], cfg shard.Config) error {
	g, err := shard.New(st, r.group, cfg)
	if err != nil {
		return err
	}
	return g.Run(ctx, func(ctx context.Context, sh shard.Shard, gr G) { r.work(ctx, sh, gr) })
}

// work runs CMD for shard sh while ctx lives: when ctx ends (the shard
// moves, or holdfast leaves), CMD gets SIGTERM, then SIGKILL after
// --kill-grace; work returns once CMD has exited, and only then is the
// shard released. A loss of the grant is handled by runUnder, as for lock.
func (r shardRunner) work(ctx context.Context, sh shard.Shard, gr holdfast.Grant) {
	name := r.group + "/" + sh.Name
	cmd := exec.Command(r.argv[0], r.argv[1:]...)
	cmd.Env = append(os.Environ(),
		"HOLDFAST_SHARD="+sh.Name, "HOLDFAST_SHARDS="+strconv.Itoa(r.n), "HOLDFAST_TOKEN="+gr.Token().String(),
		"HOLDFAST_NAME="+name, "HOLDFAST_KEY="+gr.Key())
	cmd.Stdout, cmd.Stderr = r.e.stdout, r.e.stderr
	// runUnder sends CMD SIGTERM when its context ends; SIGKILL after
	// --kill-grace goes through its signal channel.
	// exited is closed once runUnder has returned (CMD exited): the
	// escalation waits on it, not on rctx, which it cancels itself.
	rctx, stopCmd := context.WithCancel(context.Background())
	defer stopCmd()
	sigs := make(chan os.Signal, 1)
	exited, escalated := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(escalated)
		select {
		case <-ctx.Done():
		case <-exited:
			return
		}
		stopCmd()
		t := time.NewTimer(r.grace)
		defer t.Stop()
		select {
		case <-t.C:
			if !mutant.On("cmd/shard-kill-grace") {
				sigs <- syscall.SIGKILL
			}
		case <-exited:
		}
	}()
	fmt.Fprintf(r.e.stderr, "holdfast: %s: shard %s: starting CMD (token %s)\n", r.group, sh.Name, gr.Token())
	werr, lostCause, err := runUnder(rctx, gr, cmd, policing{name: name, what: "the shard", grace: r.grace, ttl: r.ttl, stderr: r.e.stderr, sigs: sigs})
	close(exited)
	<-escalated
	switch {
	case err != nil:
		fmt.Fprintf(r.e.stderr, "holdfast: %s: shard %s: cannot run CMD: %v\n", r.group, sh.Name, err)
	case lostCause != nil:
		// runUnder said so.
	case ctx.Err() != nil:
		fmt.Fprintf(r.e.stderr, "holdfast: %s: shard %s: CMD stopped (%v)\n", r.group, sh.Name, context.Cause(ctx))
	default:
		fmt.Fprintf(r.e.stderr, "holdfast: %s: shard %s: CMD exited (%v); starting it again in %v\n", r.group, sh.Name, exitText(werr), shardRestart)
	}
}

// exitText describes how CMD ended.
func exitText(werr error) string {
	if werr == nil {
		return "status 0"
	}
	return werr.Error()
}

// shardGroupView is what status prints of a shard group (the JSON of
// --json).
type shardGroupView struct {
	Backend string            `json:"backend"`
	Name    string            `json:"name"`
	Kind    string            `json:"kind"` // "shard group"
	Members []shardMemberView `json:"members"`
	Shards  []shardView       `json:"shards"`
}

type shardMemberView struct {
	ID     string `json:"id"` // the session: etcd lease ID in hex, Consul session ID
	Name   string `json:"name,omitempty"`
	Shards int    `json:"shards"` // how many it owns
}

type shardView struct {
	Shard   string   `json:"shard"`
	Owner   string   `json:"owner,omitempty"` // a member's ID, "" if free
	Token   uint64   `json:"token,omitempty"`
	Waiters []string `json:"waiters"`
}

// printShardGroup prints NAME as a shard group if st (NAME's state as a
// lock, semaphore...) shows no primitive and members of a shard group are
// there; it reports whether it did.
func printShardGroup(ctx context.Context, r reader, w io.Writer, backend string, st *holdfast.State, asJSON bool) (bool, error) {
	if st.Kind != holdfast.KindUnknown {
		return false, nil
	}
	var gs *shard.State
	var err error
	switch r := r.(type) {
	case etcdReader:
		gs, err = shard.InspectEtcd(ctx, r.c, st.Name)
	case consulReader:
		gs, err = shard.InspectConsul(ctx, r.c, st.Name)
	default:
		return false, nil
	}
	if err != nil || len(gs.Members) == 0 {
		return false, err
	}
	v := shardGroupView{Backend: backend, Name: gs.Name, Kind: "shard group", Members: []shardMemberView{}, Shards: []shardView{}}
	names := map[string]string{}
	for _, m := range gs.Members {
		v.Members = append(v.Members, shardMemberView{ID: m.ID, Name: m.Name, Shards: m.Shards})
		names[m.ID] = m.Name
	}
	for _, s := range gs.Shards {
		v.Shards = append(v.Shards, shardView{Shard: s.Shard.Name, Owner: s.Owner, Token: uint64(s.Token), Waiters: append([]string{}, s.Waiters...)})
	}
	if asJSON {
		b, err := json.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return true, err
	}
	who := func(id string) string {
		if id == "" {
			return "-"
		}
		if n := names[id]; n != "" {
			return id + " (" + n + ")"
		}
		return id
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%s: shard group on %s, %d shards, %d members\n", v.Name, backend, len(v.Shards), len(v.Members))
	fmt.Fprintln(tw, "MEMBER\tNAME\tSHARDS")
	for _, m := range v.Members {
		fmt.Fprintf(tw, "%s\t%s\t%d\n", m.ID, m.Name, m.Shards)
	}
	fmt.Fprintln(tw, "SHARD\tOWNER\tTOKEN\tWAITERS")
	for _, s := range v.Shards {
		var ws []string
		for _, id := range s.Waiters {
			ws = append(ws, who(id))
		}
		tok := "-"
		if s.Token != 0 {
			tok = strconv.FormatUint(s.Token, 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Shard, who(s.Owner), tok, strings.Join(ws, ", "))
	}
	return true, tw.Flush()
}
