// Command holdfast is the holdfast command-line tool.
//
// Usage:
//
//	holdfast <command> [flags]
//
// Commands:
//
//	lock    run a command while holding a lock
//	elect   run a command while leader of an election, or watch an election
//	status  show who holds and who waits for a lock or an election
//	dev     run an embedded one-node etcd on 127.0.0.1 for local development
//	demo    show fencing at work: a paused holder's stale write is rejected
//	bench   benchmark holdfast's locks against the stores' native recipes
//	version print the version
//	help    show help for a command
//
// Run "holdfast help <command>" for a command's flags. Exit status: 0 on
// success, 1 when a command fails (including a benchmark that saw a
// violation or an error), 2 on bad usage; lock documents its own statuses
// (the command's status, 122 lost, 124 not acquired, 125 failed...).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// command is one subcommand. To add one, write its run function and add it
// to commands.
type command struct {
	name    string
	summary string
	// usage is printed above the flag defaults by "help <name>".
	usage string
	// flags declares the command's flags on fs and returns the function
	// that runs it with the parsed flags and the remaining arguments.
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
	commands = []*command{lockCommand, electCommand, statusCommand, devCommand, demoCommand, benchCommand, versionCommand, {
		name:    "help",
		summary: "show help for a command",
		usage:   "holdfast help [command]",
	}}
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func main() {
	os.Exit(run(context.Background(), &env{stdout: os.Stdout, stderr: os.Stderr}, os.Args[1:]))
}

// run runs the command line args and returns the exit status.
func run(ctx context.Context, e *env, args []string) int {
	if len(args) == 0 {
		printUsage(e.stderr)
		return 2
	}
	name, args := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		return help(e, args)
	}
	c := lookup(name)
	if c == nil || c.flags == nil {
		fmt.Fprintf(e.stderr, "holdfast: unknown command %q\n\n", name)
		printUsage(e.stderr)
		return 2
	}
	fs := flag.NewFlagSet("holdfast "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	runFn := c.flags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printCommandUsage(e.stdout, c)
			return 0
		}
		fmt.Fprintf(e.stderr, "holdfast %s: %v\nRun 'holdfast help %s' for usage.\n", c.name, err, c.name)
		return 2
	}
	if !c.ownSignals {
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
	}
	err := runFn(ctx, e, fs.Args())
	var ue usageError
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ee.err != nil {
			fmt.Fprintf(e.stderr, "holdfast %s: %v\n", c.name, ee.err)
		}
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "holdfast %s: %v\nRun 'holdfast help %s' for usage.\n", c.name, err, c.name)
		return 2
	default:
		fmt.Fprintf(e.stderr, "holdfast %s: %v\n", c.name, err)
		return 1
	}
}

func help(e *env, args []string) int {
	switch len(args) {
	case 0:
		printUsage(e.stdout)
		return 0
	case 1:
		c := lookup(args[0])
		if c == nil {
			fmt.Fprintf(e.stderr, "holdfast help: unknown command %q\n", args[0])
			return 2
		}
		printCommandUsage(e.stdout, c)
		return 0
	default:
		fmt.Fprintln(e.stderr, "usage: holdfast help [command]")
		return 2
	}
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "holdfast: distributed locks over etcd and Consul, with fencing tokens.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: holdfast <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'holdfast help <command>' for a command's flags.")
}

func printCommandUsage(w io.Writer, c *command) {
	fmt.Fprintln(w, c.usage)
	if c.flags == nil {
		return
	}
	fs := flag.NewFlagSet("holdfast "+c.name, flag.ContinueOnError)
	c.flags(fs)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Flags:")
	fs.SetOutput(w)
	fs.PrintDefaults()
}
