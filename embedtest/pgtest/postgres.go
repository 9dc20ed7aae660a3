package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/holdfast/holdfast/embedtest/internal/testserver"
)

// postgresReadyTimeout bounds initdb plus the server's start.
const postgresReadyTimeout = 60 * time.Second

// PostgresServer is a throwaway PostgreSQL server: a fresh cluster in a
// temporary directory, listening on 127.0.0.1 only, with trust
// authentication and durability off (fsync, synchronous commit), for tests.
type PostgresServer struct {
	// DSN connects to its "postgres" database as the "postgres" user, for
	// database/sql with the "pgx" driver (github.com/jackc/pgx/v5/stdlib).
	DSN string
	// Port is its TCP port on 127.0.0.1.
	Port int

	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	out  testserver.TailBuffer
}

// PostgresBinDir returns the directory of PostgreSQL's server programs
// (initdb, postgres): $PG_BIN if set, else the directory of initdb on PATH,
// else the newest /usr/lib/postgresql/<version>/bin (Debian's layout).
func PostgresBinDir() (string, error) {
	if dir := os.Getenv("PG_BIN"); dir != "" {
		return dir, testserver.CheckExecutable(filepath.Join(dir, "initdb"))
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, d := range dirs {
		if testserver.CheckExecutable(filepath.Join(d, "initdb")) == nil {
			return d, nil
		}
	}
	return "", errors.New("pgtest: PostgreSQL server programs not found (set PG_BIN, or install Debian's postgresql package)")
}

func pgVersion(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// StartPostgres initialises a cluster in a new temporary directory and
// starts its server. When the process runs as root, which PostgreSQL
// refuses, the server runs as the "postgres" user (Debian's package creates
// it). Close stops the server and removes the directory.
func StartPostgres() (*PostgresServer, error) {
	bin, err := PostgresBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "holdfast-pg-")
	if err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: running as root and no postgres user to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: initdb: %v: %s", err, testserver.Tail(string(out), 2000))
	}
	for attempt := 0; ; attempt++ {
		p, err := startPostgres(bin, dir, data, cred)
		if err == nil {
			return p, nil
		}
		if !testserver.IsAddrInUse(err) || attempt == 4 {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

func startPostgres(bin, dir, data string, cred *syscall.Credential) (*PostgresServer, error) {
	port, err := testserver.FreePort(false)
	if err != nil {
		return nil, err
	}
	p := &PostgresServer{
		DSN:  fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		Port: port,
		dir:  dir,
		done: make(chan struct{}),
		out:  testserver.TailBuffer{Max: 64 << 10},
	}
	p.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port), "-h", "127.0.0.1", "-k", dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=200")
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		testserver.ReleasePorts([]int{port})
		return nil, err
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	if err := p.waitReady(); err != nil {
		p.stop()
		testserver.ReleasePorts([]int{port})
		if testserver.IsAddrInUse(errors.New(p.out.String())) {
			return nil, fmt.Errorf("pgtest: postgres port %d: address already in use", port)
		}
		return nil, fmt.Errorf("pgtest: postgres: %w\n%s", err, testserver.Tail(p.out.String(), 2000))
	}
	return p, nil
}

func (p *PostgresServer) waitReady() error {
	db, err := sql.Open("pgx", p.DSN)
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(postgresReadyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := db.PingContext(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return errors.New("the server exited while starting")
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within %v: %w", postgresReadyTimeout, err)
		}
	}
}

// Open returns a database/sql handle on the server (driver "pgx").
func (p *PostgresServer) Open() (*sql.DB, error) { return sql.Open("pgx", p.DSN) }

// Output returns the tail of the server's log.
func (p *PostgresServer) Output() string { return p.out.String() }

// stop ends the server: a fast shutdown (SIGINT), then SIGKILL after 10 s.
func (p *PostgresServer) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// Close stops the server and removes its directory.
func (p *PostgresServer) Close() {
	p.stop()
	testserver.ReleasePorts([]int{p.Port})
	os.RemoveAll(p.dir)
}

// Postgres starts a PostgreSQL server for t and stops it when t ends.
func Postgres(t testing.TB) *PostgresServer {
	t.Helper()
	p, err := StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
