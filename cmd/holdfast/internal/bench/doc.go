// Package bench is the benchmark harness behind `holdfast bench`: it runs
// holdfast's locks and the stores' native recipes (etcd's concurrency.Mutex,
// Consul's api.Lock) side by side against the same server, in one run,
// together with the floor (the store's own limit, below), and reports
// throughput, handoff latency, fairness, store requests and bytes per
// acquisition and takeover time after a holder's session dies.
//
// # Model
//
// A Target is a running store (embedded or external) with the implementations
// to compare on it. An Impl makes Contenders; every contender has its own
// client connection and its own session, as separate processes would, and
// counts its own store requests. A contender's Lock returns a Held whose
// Unlock releases the lock. Nothing in-process stands in for the store: the
// only shared state between contenders is the measurement itself.
//
// # The floor
//
// Every contended setting also runs a third implementation, "floor": the
// cheapest protocol the store allows for passing a turn from one client to
// the next, with no safety at all. It is the physical limit the locks are
// measured against: with the same server, the same number of clients (each
// its own connection, as the other contenders), the same hold and the same
// harness, no lock on this store can hand over faster than one write and one
// notification, so each holdfast and native row reports of_floor, its
// acq_per_s divided by the floor's.
//
//   - etcd: contender i watches its own key <lock>/floor/<i> (a watch opened
//     when the contender is created, from the revision after the one it
//     read); its Lock returns when a put event on that key arrives, and its
//     Unlock puts contender i+1's key (mod n). One unary Put and one watch
//     event per turn.
//   - Consul: contender i creates its key, then holds a blocking query on it
//     (GET ?index=<its last ModifyIndex>); its Lock returns when the
//     ModifyIndex moves, and its Unlock PUTs contender i+1's key. One PUT
//     and one blocking GET per turn.
//
// Contender 0 holds the first turn. A "turn" is an acquisition and is
// counted by the same code as the locks' (acquisitions, handoffs, waits,
// fairness); exactly one contender holds the single turn by construction,
// and the same inside-counter counts any overlap as a violation. The floor
// has no session, no lease, no queue, and survives nothing: a crashed
// contender stops the relay for good, and a stale or duplicated write would
// admit two holders. A safe FIFO lock must add to it: writing its own queue
// entry (with a lease or session, so that a crash frees the lock), a check
// at grant time that its entry still exists and that no one queued before
// it is still there (a read, or a guarded transaction), and a release that
// can only remove its own entry (a guarded delete). Only the release and
// the waiter's notification and check sit on the handoff's critical path;
// enqueueing happens while the previous holder holds.
//
// # Alternation
//
// Contended settings run in rounds (Options.Rounds, default 3): every
// implementation's contenders are opened first, then each round runs a
// warm-up and a measured window of Duration/Rounds for holdfast, native and
// floor in turn, so that drift on a shared machine hits all three. A row
// aggregates its implementation's windows (counts, latencies and requests
// added; percentiles over all samples); duration_s is the total measured
// time and rounds the number of windows.
//
// # Scenarios
//
// Scenarios are registered (scenarioSpec: a name, whether "all" runs it, the
// function that runs its rows, and its quick settings); a scenario in a file
// of its own registers itself from an init function with registerScenario.
// Run runs one of them or "all".
//
//   - lock (1, 8, 32 contenders, hold 0) and handoff (8, 32, hold 1 ms):
//     holdfast, native and floor.
//   - semaphore (limit 4; 8 and 32 contenders; hold 0 and 1 ms): holdfast,
//     api.Semaphore on Consul (etcd has no native semaphore) and a floor
//     whose relay carries limit turns at once.
//   - waiters (ScenarioWaiters): W waiters on one lock (W+1 contenders), for
//     W = 2, 16, 128, 512 (Options.Waiters), hold 0: how requests, bytes and
//     handoff latency per acquisition grow with the queue. Every contender
//     of every implementation is opened before the first round (32 at a
//     time, at most 2 minutes per implementation; 512 waiters are 1,539
//     clients and sessions), and each round warms up for at least 2 ms per
//     waiter so that the queue is full when the window opens. While one
//     implementation is measured the others' sessions stay open and renew
//     (etcd: one LeaseKeepAlive per session every TTL/3; Consul: one renew
//     request per session every TTL/2), a background load that falls on
//     all three alike. With many waiters a window holds fewer acquisitions
//     than there are waiters, so fairness there only says how far the queue
//     got, not whether it is FIFO.
//   - takeover and election: two contenders and a kill; no floor (there is
//     no turn to pass).
//
// Options.Quick (`holdfast bench --quick`) runs each scenario with its quick
// settings: lock at 1 and 4 contenders, handoff at 4, semaphore limit 2 at 4,
// waiters 2 and 16 (counts given in Options are kept), takeover and election
// once at lock-delay 0, every contended setting in 3 rounds of 50 ms warm-up
// and 200 ms window. On the development machine `--quick --scenario all`
// took about 15 s on etcd and 10 s on Consul (loaded: 25 s and 20 s).
//
// Nodes: StartEtcdNodes(3) (`--nodes 3`) starts an
// embedded 3-member etcd cluster in this process; every contender's client
// gets all three endpoints. Rows report nodes.
//
// # Measurements
//
// Contended rows (lock, handoff, semaphore, waiters) start every contender,
// let them run a warm-up, then measure for a fixed window, Rounds times (see
// Alternation); only acquisitions whose Lock returned inside a window count.
// Sessions are created before and closed after the setting, outside the
// windows. Every row is one JSON object (Result; --json prints one per line,
// and one {"ratio": {...}} object per holdfast/native pair, Ratio); fields
// that do not apply to a row are null.
//
//   - scenario, backend, impl ("holdfast", "native" or "floor"),
//     contenders, nodes (store members), rounds, hold_ms, duration_s (the
//     measured time, all rounds), ttl_s; limit (semaphore rows), waiters
//     (waiters rows), note, first_error.
//   - acquisitions, acq_per_s: Lock calls that returned a grant in the window.
//   - handoffs, handoffs_per_s: acquisitions where the holder changed (the
//     previous acquisition, in or before the window, was by another contender).
//   - handoff_p50_ms, handoff_p99_ms: on those acquisitions, from the moment
//     the previous holder called Unlock to the moment this holder's Lock
//     returned.
//   - wait_p50_ms, wait_p99_ms: Lock call to Lock return, every acquisition.
//   - cycle_p50_ms: Lock call to Unlock return; reported on rows with one
//     contender only (the uncontended cycle).
//   - fairness: Jain's index over per-contender acquisition counts
//     ((sum x)^2 / (n * sum x^2); 1 is perfectly even, 1/n is one contender
//     taking everything).
//   - rpcs, rpcs_per_acq, rpc_unit: store requests sent by all contenders
//     during the windows, divided by acquisitions. etcd ("grpc-unary"): unary
//     gRPC calls counted by a grpc.UnaryClientInterceptor on every
//     contender's client (each retry counts; streams such as Watch and
//     LeaseKeepAlive are not counted, their openings are reported apart as
//     streams_per_acq). Consul ("http-request"): HTTP requests counted by an
//     http.RoundTripper around every contender's api.Client, blocking
//     queries included.
//   - bytes_per_acq: bytes received by all contenders during the windows,
//     divided by acquisitions. etcd: a grpc stats.Handler on every client
//     adds each received message's wire length (stats.InPayload.WireLength:
//     the protobuf message plus gRPC's 5-byte prefix), for unary responses
//     and stream messages alike (watch events and watch control messages,
//     keepalive responses), plus the HPACK-compressed header and trailer
//     frames (stats.InHeader/InTrailer.WireLength); HTTP/2 frame headers and
//     control frames are not counted. Consul: the response body bytes read
//     through the same RoundTripper (status lines and headers not counted).
//   - of_floor: the row's acq_per_s divided by the floor row's of the same
//     setting (null on the floor row). A native row's of_floor counts
//     acquisitions, not handoffs: api.Lock at hold 0 mostly gives the lock
//     back to the contender that just released it (handoffs_per_s near 0),
//     which no FIFO lock and no floor turn does. On the ratio object,
//     holdfast_of_floor and native_of_floor; the table's vs_native column is
//     the ratio's acq_per_s (holdfast / native).
//   - violations: times a contender's Lock returned while another contender
//     (semaphore: limit others) was still inside its critical section (an
//     atomic "inside" counter decremented just before Unlock is called). The
//     floor's rows are counted the same way. Must be 0.
//   - errors: Lock or Unlock failures other than the cancellation that ends a
//     row.
//
// Takeover rows: a holder holds, a waiter waits, and the holder's session is
// destroyed (Consul) or its lease revoked (etcd) from a separate client;
// takeover_ms is from the return of that call to the return of the waiter's
// Lock, notice_ms to the moment the holder is told of its loss. Each setting
// is repeated and the median reported.
package bench
