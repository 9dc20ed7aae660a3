// Command holdfast is the holdfast command-line tool: run a command under a
// lock, a semaphore permit or leadership, watch who holds what, and try
// holdfast locally.
//
// Usage:
//
//	holdfast <command> [flags] [arguments]
//
// Commands:
//
//	lock       run a command while holding a lock
//	once       run a command at most once per period across a fleet (cron)
//	elect      run a command while leader of an election, or watch an election
//	shard      run one command per shard this process owns in a group shared by many processes
//	status     show who holds and who waits for a lock, a semaphore, a read-write lock or an election
//	dev        run an embedded one-node etcd on 127.0.0.1 for local development
//	demo       show fencing at work: a paused holder's stale write is rejected
//	bench      benchmark holdfast's locks against the stores' native recipes
//	soak       run the safety suite under injected faults for as long as asked
//	version    print holdfast's version and the versions it was built with
//	completion generate a shell completion script (bash, zsh, fish, powershell)
//	help       show help for a command
//
// Secured clusters: lock, elect and status take --cacert, --cert and --key
// (TLS, mutual TLS), --user and --password (etcd auth) and --token (Consul
// ACLs), defaulting to the native tools' variables (ETCDCTL_CACERT,
// ETCDCTL_CERT, ETCDCTL_KEY, ETCDCTL_USER, ETCDCTL_PASSWORD; CONSUL_CACERT,
// CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY, CONSUL_HTTP_TOKEN, CONSUL_HTTP_SSL,
// https:// addresses). No output ever shows a password, token or key.
//
// Run "holdfast help <command>" for a command's flags. Exit status: 0 on
// success, 1 when a command fails (including a benchmark that saw a
// violation or an error), 2 on a usage or input error found before any
// request; lock, elect, once and status document their own statuses (the
// command's status, 122 lost, 124 not acquired, 125 failed...), with the
// same 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// command is one subcommand. To add one, write its run function and add it
// to commands.
type command struct {
	name    string
	summary string
	// usage is the help text: "usage: holdfast <name> <synopsis>", more
	// synopsis lines, a blank line, then the description.
	usage string
	// flags declares the command's flags on fs and returns the function
	// that runs it with the parsed flags and the positional arguments.
	flags func(fs *flag.FlagSet) func(ctx context.Context, env *env, args []string) error
	// ownSignals: the command handles SIGINT and SIGTERM itself (it passes
	// them on to a child); other commands' context is cancelled by them.
	ownSignals bool
}

// env is what a command may use of its surroundings; tests replace it.
type env struct {
	stdout io.Writer
	stderr io.Writer
}

// usageError is a bad command line: the message is printed with a hint and
// the process exits with status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

var commands []*command

func init() {
	commands = []*command{lockCommand, onceCommand, electCommand, shardCommand, statusCommand, devCommand, demoCommand, benchCommand, soakCommand, versionCommand}
}

func main() {
	code := run(context.Background(), &env{stdout: os.Stdout, stderr: os.Stderr}, os.Args[1:])
	if interrupted.Load() && code == 128+int(syscall.SIGINT) {
		// CMD died of SIGINT (Ctrl-C), or holdfast got it while waiting:
		// die of it too, as the shell's convention asks, so that a script
		// that ran holdfast stops as well instead of going on. Everything
		// is released by now. If SIGINT was ignored when holdfast started
		// (a background job of a script), the exit status says it.
		signal.Reset(syscall.SIGINT)
		_ = syscall.Kill(os.Getpid(), syscall.SIGINT)
		time.Sleep(time.Second)
	}
	os.Exit(code)
}

// interrupted is set when CMD died of SIGINT, or holdfast got SIGINT while
// waiting: main then ends holdfast by SIGINT (see main).
var interrupted atomic.Bool

// newRoot builds the command tree (github.com/spf13/cobra, which also gives
// help and shell completion) over commands; each command's flags are
// declared on a flag.FlagSet and handed to cobra's parser.
func newRoot(ctx context.Context, e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "holdfast",
		Short: "distributed locks, semaphores and elections over etcd and Consul, with fencing tokens",
		Long: `holdfast: distributed locks, semaphores and leader election over etcd and
Consul, with fencing tokens, in the native key layouts (etcdctl lock/elect,
consul lock).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			_ = cmd.Usage()
			return exitError{code: 2}
		},
	}
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err.Error()} })
	for _, c := range commands {
		fs := flag.NewFlagSet("holdfast "+c.name, flag.ContinueOnError)
		runFn := c.flags(fs)
		use, long := splitUsage(c)
		cc := &cobra.Command{
			Use:   use,
			Short: c.summary,
			Long:  long,
			RunE: func(cmd *cobra.Command, args []string) error {
				ctx := cmd.Context()
				if !c.ownSignals {
					var stop context.CancelFunc
					ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
					defer stop()
				}
				ctx = context.WithValue(ctx, dashKey{}, cmd.ArgsLenAtDash())
				ctx = context.WithValue(ctx, changedKey{}, cmd.Flags().Changed)
				return runFn(ctx, e, args)
			},
		}
		cc.Flags().AddGoFlagSet(fs)
		cc.Flags().VisitAll(func(f *pflag.Flag) {
			if f.DefValue == "0s" || f.DefValue == "-1ns" { // "unset": the usage says the default
				f.DefValue = ""
			}
		})
		root.AddCommand(cc)
	}
	root.SetHelpCommand(&cobra.Command{
		Use:   "help [command]",
		Short: "show help for a command",
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return root.Help()
			}
			target, rest, err := root.Find(args)
			if err != nil || target == root || len(rest) > 0 {
				fmt.Fprintf(e.stderr, "holdfast help: unknown command %q\n\n", strings.Join(args, " "))
				root.SetOut(e.stderr)
				_ = root.Usage()
				return exitError{code: 2}
			}
			return target.Help()
		},
	})
	root.SetContext(ctx)
	return root
}

// dashKey is the context key of the number of positional arguments before
// "--" on the command line (-1 without "--").
type dashKey struct{}

// argsBeforeDash returns the number of positional arguments before "--",
// or -1 if there was none.
func argsBeforeDash(ctx context.Context) int {
	if n, ok := ctx.Value(dashKey{}).(int); ok {
		return n
	}
	return -1
}

// changedKey is the context key of a func reporting whether a flag was
// given on the command line.
type changedKey struct{}

// flagGiven reports whether the flag called name was given on the command
// line (not merely left at its default).
func flagGiven(ctx context.Context, name string) bool {
	changed, ok := ctx.Value(changedKey{}).(func(string) bool)
	return ok && changed(name)
}

// splitUsage turns a command's usage text into cobra's Use line and Long
// description (further synopsis lines lead the description).
func splitUsage(c *command) (use, long string) {
	synopsis, desc, _ := strings.Cut(c.usage, "\n\n")
	lines := strings.Split(synopsis, "\n")
	use = strings.TrimPrefix(strings.TrimSpace(lines[0]), "usage: holdfast ")
	var more []string
	for _, l := range lines[1:] {
		more = append(more, strings.TrimPrefix(strings.TrimSpace(l), "holdfast "))
	}
	long = c.summary
	if len(more) > 0 {
		long += "\n\nAlso:\n  holdfast " + strings.Join(more, "\n  holdfast ")
	}
	if desc != "" {
		long += "\n\n" + desc
	}
	return use, long
}

// run runs the command line args and returns the exit status.
func run(ctx context.Context, e *env, args []string) int {
	root := newRoot(ctx, e)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	name := "holdfast"
	if cmd != nil && cmd != root {
		name = "holdfast " + cmd.Name()
	}
	var ue usageError
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ee.err != nil {
			fmt.Fprintf(e.stderr, "%s: %v\n", name, ee.err)
		}
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "%s: %v\nRun '%s --help' for usage.\n", name, err, name)
		return 2
	case strings.HasPrefix(err.Error(), "unknown command"), strings.Contains(err.Error(), "accepts no arguments"):
		fmt.Fprintf(e.stderr, "holdfast: %v\n\n", err)
		root.SetOut(e.stderr)
		_ = root.Usage()
		return 2
	default:
		fmt.Fprintf(e.stderr, "%s: %v\n", name, err)
		return 1
	}
}
